"""The course's own tooling, not its teaching material: building the notebooks and
exercises from their sources (:mod:`~coursekit.course.notebooks`), the student release
(:mod:`~coursekit.course.release`) and grading submitted exercises into a gradebook
(:mod:`~coursekit.course.gradebook`). Run them as ``coursekit notebooks ...`` and
``coursekit release ...`` (or ``python -m coursekit notebooks ...``)."""
