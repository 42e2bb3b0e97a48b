"""The course's own tooling, not its teaching material: building the notebooks and
exercises from their sources (:mod:`~coursekit.course.notebooks`), the student release
(:mod:`~coursekit.course.release`) and grading submitted exercises into a gradebook
(:mod:`~coursekit.course.gradebook`), written for an LMS to import (:mod:`~coursekit.course.lms`)
with a feedback file per student (:mod:`~coursekit.course.feedback`). Run them as ``coursekit notebooks ...`` and
``coursekit release ...`` (or ``python -m coursekit notebooks ...``)."""
