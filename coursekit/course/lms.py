"""Write the gradebook in the wide shape a learning management system imports.

One line per student, one column per exercise holding the points scored; the points
possible of an exercise are the number of checks the official exercise calls
(:attr:`Row.total <coursekit.course.gradebook.Row>`), the points scored the checks passed.
A notebook that was missing, timed out or raised scores what it scored (0 if missing)
and keeps its column. Students and exercises are in alphabetical order; a student with
no row for an exercise gets an empty cell (not graded) there.

``canvas``
    The columns of Canvas's own gradebook export: ``Student``, ``ID``, ``SIS User ID``,
    ``SIS Login ID``, ``Section``, then one column per exercise, and a ``Points Possible``
    line right under the header. The student id (the submission folder's name) fills
    ``SIS Login ID``; ``Student``, ``ID`` (Canvas's own number), ``SIS User ID`` and
    ``Section`` are left empty.
``moodle``
    For Moodle's "Import grades from CSV": a ``student`` column holding the student id,
    which the teacher maps to Moodle's username, email address or ID number in the import
    form, then one column per exercise (the teacher maps each to a grade item). Moodle
    takes a grade item's maximum from the item, not from the file, so there is no points
    possible line (it would be read as a student): :func:`points_possible` gives them.
"""

from __future__ import annotations

import csv
from pathlib import Path

from coursekit.course.gradebook import GradingError, Row

CANVAS_STUDENT_COLUMNS = ("Student", "ID", "SIS User ID", "SIS Login ID", "Section")
CANVAS_ID_COLUMN = "SIS Login ID"
CANVAS_POINTS_POSSIBLE = "Points Possible"
MOODLE_ID_COLUMN = "student"


def points_possible(rows: list[Row]) -> dict[str, int]:
    """Each exercise's points possible, alphabetically; every row of an exercise must agree."""
    possible: dict[str, int] = {}
    for row in rows:
        if possible.setdefault(row.exercise, row.total) != row.total:
            raise GradingError(f"{row.exercise} is worth {possible[row.exercise]} points in one row and "
                               f"{row.total} in another ({row.student}): grade every student against the same exercises")
    return dict(sorted(possible.items()))


def scores(rows: list[Row]) -> dict[str, dict[str, int]]:
    """student -> exercise -> points scored, students alphabetically; one row per pair."""
    table: dict[str, dict[str, int]] = {}
    for row in rows:
        if row.exercise in table.setdefault(row.student, {}):
            raise GradingError(f"{row.student} has two rows for {row.exercise}")
        table[row.student][row.exercise] = row.passed
    return dict(sorted(table.items()))


def write_canvas(rows: list[Row], out: Path) -> None:
    """The Canvas gradebook import: header, Points Possible line, one line per student."""
    possible = points_possible(rows)
    blank = dict.fromkeys(CANVAS_STUDENT_COLUMNS, "")
    lines = [{**blank, "Student": CANVAS_POINTS_POSSIBLE, **possible}]
    lines += [{**blank, CANVAS_ID_COLUMN: student, **scored} for student, scored in scores(rows).items()]
    _write(out, [*CANVAS_STUDENT_COLUMNS, *possible], lines)


def write_moodle(rows: list[Row], out: Path) -> None:
    """The Moodle CSV grade import: the student id, then one column per exercise."""
    lines = [{MOODLE_ID_COLUMN: student, **scored} for student, scored in scores(rows).items()]
    _write(out, [MOODLE_ID_COLUMN, *points_possible(rows)], lines)


WRITERS = {"canvas": write_canvas, "moodle": write_moodle}


def _write(out: Path, header: list[str], lines: list[dict]) -> None:
    with open(out, "w", newline="", encoding="utf-8") as stream:
        writer = csv.DictWriter(stream, fieldnames=header, restval="")
        writer.writeheader()
        writer.writerows(lines)
