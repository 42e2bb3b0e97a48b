"""Write one feedback file per student: ``FOLDER/<student>.md``.

For each exercise: the score out of the points possible and the status, the first error
of a notebook that raised or ran out of time, and every check that did not pass with the
check's own message (what the student saw printed under FAIL or TODO), or a note that
the check never ran. Exercises are in alphabetical order; checks in the order
:func:`~coursekit.course.gradebook.expected_checks` gives.
"""

from __future__ import annotations

from pathlib import Path

from coursekit.course.gradebook import GradingError, Row

LABELS = {"fail": "FAIL", "todo": "TODO", "not run": "NOT RUN"}


def feedback(student: str, rows: list[Row]) -> str:
    """The Markdown feedback for one student's rows."""
    lines = [f"# Feedback for {student}", ""]
    for row in sorted(rows, key=lambda row: row.exercise):
        lines += [f"## {row.exercise}: {row.passed}/{row.total} ({row.status})", ""]
        if row.status == "missing":
            lines += [f"Not handed in ({row.detail}).", ""]
            continue
        if row.detail:
            lines += [f"{row.status.capitalize()}: {row.detail}", ""]  # the first error, or the time limit
        if row.passed == row.total:
            lines += ["Every check passed.", ""]
            continue
        lines += [f"- {LABELS.get(o.status, o.status.upper())} `{o.name}`: {_one_block(o.message)}"
                  for o in row.checks if o.status != "pass"]
        lines.append("")
    return "\n".join(lines).rstrip("\n") + "\n"


def write_feedback(rows: list[Row], folder: Path) -> list[Path]:
    """Write ``folder/<student>.md`` for every student in ``rows``; return the files."""
    folder = prepare_folder(folder)
    students: dict[str, list[Row]] = {}
    for row in rows:
        students.setdefault(row.student, []).append(row)
    written = []
    for student, own in sorted(students.items()):
        path = folder / f"{student}.md"
        path.write_text(feedback(student, own), encoding="utf-8")
        written.append(path)
    return written


def prepare_folder(folder: Path) -> Path:
    """Create the feedback folder (the command does it before grading, so a bad path fails
    at once); refuse a path that is a file."""
    folder = Path(folder)
    if folder.exists() and not folder.is_dir():
        raise GradingError(f"{folder} is a file; give a folder (new or existing) for the feedback files")
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _one_block(message: str) -> str:
    """A multi-line message indented under its list item."""
    return message.strip().replace("\n", "\n  ")
