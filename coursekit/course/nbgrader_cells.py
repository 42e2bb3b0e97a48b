"""nbgrader's cell metadata, which the builder writes into every solution notebook.

nbgrader (``nbgrader generate_assignment``, ``autograde``) knows a notebook's parts by each
cell's ``metadata.nbgrader`` (schema version 3: nbgrader/nbgraderformat/v3.json). Every cell
of a solution notebook gets one of three roles:

* a code cell with a ``### BEGIN SOLUTION`` block is a *solution cell* (not locked): the
  student writes there; nbgrader's release replaces the block by its stub;
* a code cell that calls a course check (:func:`coursekit.course.gradebook.checks_by_cell`)
  is an *autograded test cell*, locked, worth 1 point, its ``grade_id`` the check's name.
  nbgrader scores a test cell by whether it raised, and a check raises under nbgrader when it
  does not pass (:mod:`coursekit.grading.core`); the course's gradebook gives a point per
  check the exercise calls, passed if every call passed. The two agree because a test cell
  calls one check and no other cell calls it: the builder refuses anything else;
* every other cell is *read-only* (locked): nbgrader's autograde puts the instructor's
  version back, so the solution cells are all that is the student's.

A ``grade_id`` is stable across rebuilds: the check's name, or for the other cells the cell's
id (``cell-004``, from its position in the source). A solution block in a markdown cell is
refused: nbgrader would grade that answer by hand, and the gradebooks would disagree.

The notebook's ``jupytext`` metadata tells jupytext to leave this metadata out of a source it
writes from the notebook: the source holds only what the builder reads.
"""

from __future__ import annotations

import nbformat

from coursekit.course import gradebook
from coursekit.course import notebooks as nb

SCHEMA_VERSION = 3
JUPYTEXT = {"cell_metadata_filter": "-nbgrader"}


def mark(notebook: nbformat.NotebookNode, name: str = "notebook") -> nbformat.NotebookNode:
    """Give every cell of a solution notebook its nbgrader metadata (in place; returned).

    Raises :class:`~coursekit.course.notebooks.NotebookError`, naming ``name`` and the cell,
    for a broken solution block, a solution block in a markdown cell or in a test cell, a
    cell that calls two checks, or a check called in two cells.
    """
    checks = gradebook.checks_by_cell(notebook)
    callers: dict[str, str] = {}
    for cell, called in zip(notebook.cells, checks):
        where = f"{name}, cell {cell.id}"
        try:
            solution = nb.strip_solutions(cell.source) != cell.source
        except nb.NotebookError as error:
            raise nb.NotebookError(f"{where}: {error}") from None
        if solution and (cell.cell_type != "code" or called):
            raise nb.NotebookError(
                f"{where}: a solution block belongs in a code cell that calls no check (a written "
                "answer cannot be checked, and a test cell is locked)")
        if len(called) > 1:
            raise nb.NotebookError(f"{where}: calls {', '.join(called)}: call each check in a cell of its "
                                   "own (nbgrader scores a cell, the course a check)")
        for check in called:
            if check in callers:
                raise nb.NotebookError(f"{where}: calls {check}, which cell {callers[check]} calls "
                                       "already: call each check in one cell")
            callers[check] = cell.id
        cell.metadata["nbgrader"] = cell_metadata(cell.id, solution, called[0] if called else None)
    notebook.metadata["jupytext"] = JUPYTEXT
    return notebook


def cell_metadata(cell_id: str, solution: bool, check: str | None) -> dict:
    """One cell's ``metadata.nbgrader``: a solution cell, the test cell of ``check``, or read-only."""
    if check:
        return {"grade": True, "grade_id": check, "locked": True, "points": 1, "schema_version": SCHEMA_VERSION,
                "solution": False}
    return {"grade": False, "grade_id": cell_id, "locked": not solution, "schema_version": SCHEMA_VERSION,
            "solution": solution}
