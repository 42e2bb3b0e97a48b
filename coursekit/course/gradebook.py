"""Grade a class's exercise notebooks into a CSV gradebook.

``SUBMISSIONS/<student>/<exercise>.ipynb``: one folder per student, its name the
student id, holding that student's exercise notebooks under the names of
``exercises/``. Each notebook runs top to bottom in a fresh kernel (every cell, even
after an error, as nbgrader does), in a private working folder and a private
``IPYTHONDIR``, within a time limit for the whole notebook. Afterwards every process
started under that IPYTHONDIR (the kernel, a cluster the notebook started, anything
it spawned) is ended, so a notebook that loops forever costs ``timeout`` seconds and
leaves nothing behind.

Checks are counted from a structured record, not from printed text: the kernel gets
``COURSEKIT_GRADING_LOG`` and every check appends its result there
(:mod:`coursekit.grading.core`). The checks that count are the ones the official
exercise calls (found in its code), so deleting a check cell loses its point; a check
passes if every call of it passed. Student code runs in the same kernel as the checks
and could forge that record: the gradebook is for honest classes, not an exam lock.

One row per student and exercise: student, exercise, passed, total, status (``ok``,
``error``: a cell raised, ``timeout``, ``missing``), seconds, detail (the first error).
Each :class:`Row` also keeps every counted check's outcome with the check's own message,
for the students' feedback files (:mod:`coursekit.course.feedback`); the LMS gradebooks
are written by :mod:`coursekit.course.lms`.
"""

from __future__ import annotations

import ast
import csv
import json
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import nbformat

from coursekit.grading.core import GRADING_LOG, CheckResult
from coursekit.cluster.processes import end_processes, ipython_dir_processes

TIMEOUT_S = 300.0
GRADING_MODULE = "coursekit.grading"


class GradingError(ValueError):
    """A submissions folder or exercise folder that cannot be graded."""


@dataclass(frozen=True)
class Row:
    """One student's grade for one exercise; ``checks`` holds one outcome per counted check."""

    student: str
    exercise: str
    passed: int
    total: int
    status: str
    seconds: float
    detail: str = ""
    checks: tuple[CheckResult, ...] = ()  # status "pass", "fail", "todo" or "not run"


#: the long CSV's columns, in order (a Row's fields but its checks)
COLUMNS = ("student", "exercise", "passed", "total", "status", "seconds", "detail")
NOT_RUN = "this check did not run (its cell was not reached, raised before the check, or was deleted)"


def expected_checks(exercise: nbformat.NotebookNode) -> list[str]:
    """Names of the checks the exercise calls: functions imported from coursekit.grading."""
    return sorted({name for called in checks_by_cell(exercise) for name in called})


def checks_by_cell(notebook: nbformat.NotebookNode) -> list[list[str]]:
    """For each cell, the checks it calls (functions imported from coursekit.grading in any
    cell), each named once; [] for a markdown cell."""
    imported, called = set(), []
    for cell in notebook.cells:
        calls = []
        if cell.cell_type == "code":
            code = "\n".join(line for line in cell.source.split("\n") if not line.lstrip().startswith(("%", "!")))
            for node in ast.walk(ast.parse(code)):
                if isinstance(node, ast.ImportFrom) and (node.module or "").startswith(GRADING_MODULE):
                    imported |= {alias.asname or alias.name for alias in node.names}
                elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                    calls.append(node.func.id)
        called.append(calls)
    return [list(dict.fromkeys(name for name in calls if name in imported)) for calls in called]


def grade(submissions: Path, exercises: Path, timeout: float = TIMEOUT_S, progress=None) -> list[Row]:
    """Run every student's notebook of every exercise in ``exercises``; one Row each."""
    submissions, exercises = Path(submissions), Path(exercises)
    official = {p.stem: nbformat.read(p, as_version=4) for p in sorted(exercises.glob("*.ipynb"))}
    if not official:
        raise GradingError(f"no exercise notebooks (*.ipynb) in {exercises}: give the course's exercises/ folder")
    if not submissions.is_dir():
        raise GradingError(f"{submissions} is not a folder: give a folder with one subfolder per student")
    students = sorted(p for p in submissions.iterdir() if p.is_dir() and not p.name.startswith("."))
    if not students:
        raise GradingError(f"{submissions} has no student folders: put each student's notebooks "
                           f"in SUBMISSIONS/<student id>/ (e.g. {next(iter(official))}.ipynb)")
    if timeout <= 0:
        raise GradingError(f"timeout must be a positive number of seconds, got {timeout}")
    rows = []
    for student in students:
        for name, exercise in official.items():
            row = grade_notebook(student.name, student / f"{name}.ipynb", expected_checks(exercise), timeout)
            if progress:
                progress(f"{row.student:>12} {row.exercise:<28} {row.passed}/{row.total} {row.status} "
                         f"({row.seconds:.1f} s) {row.detail}".rstrip())
            rows.append(row)
    return rows


def grade_notebook(student: str, path: Path, checks: list[str], timeout: float) -> Row:
    """Run one submitted notebook in a fresh kernel and count its checks."""
    if not path.is_file():
        return Row(student, path.stem, 0, len(checks), "missing", 0.0, f"no {path.name}", _outcomes(checks, {}))
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="coursekit-grade-") as scratch:
        ipython_dir, workdir, log = Path(scratch, "ipython"), Path(scratch, "work"), Path(scratch, "checks.jsonl")
        ipython_dir.mkdir()
        workdir.mkdir()
        try:
            status, detail = _execute(path, workdir, timeout, {"IPYTHONDIR": str(ipython_dir), GRADING_LOG: str(log)})
        finally:
            end_processes(ipython_dir_processes(str(ipython_dir)))
        outcomes = _outcomes(checks, _results(log))
    passed = sum(1 for outcome in outcomes if outcome.status == "pass")
    return Row(student, path.stem, passed, len(checks), status, round(time.monotonic() - started, 1), detail,
               outcomes)


def _execute(path: Path, workdir: Path, timeout: float, env: dict[str, str]) -> tuple[str, str]:
    """Run every cell; return (status, detail). The limit is for the whole notebook."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    try:
        notebook = nbformat.read(path, as_version=4)
    except Exception as error:  # a broken file is the student's error, not the grader's
        return "error", f"not a readable notebook: {type(error).__name__}: {error}"
    deadline = time.monotonic() + timeout
    client = NotebookClient(
        notebook, kernel_name="python3", allow_errors=True, shutdown_kernel="immediate",
        timeout_func=lambda cell: max(1, int(deadline - time.monotonic() + 0.999)),
        resources={"metadata": {"path": str(workdir)}},
    )
    kernel_env = {k: v for k, v in os.environ.items() if k != "COURSEKIT_CLUSTER"}  # start own clusters
    try:
        client.execute(env={**kernel_env, **env})
    except CellTimeoutError:
        return "timeout", f"stopped after {timeout:g} s"
    except DeadKernelError as error:
        return "error", f"the kernel died: {error}"
    errors = [(i, o) for i, c in enumerate(notebook.cells) if c.cell_type == "code"
              for o in c.outputs if o.output_type == "error"]
    if errors:
        index, error = errors[0]
        return "error", f"cell {index}: {error.ename}: {error.evalue}"[:300]
    return "ok", ""


def _results(log: Path) -> dict[str, list[tuple[str, str]]]:
    """Every call of every check in the structured log: name -> [(status, message), ...]."""
    results: dict[str, list[tuple[str, str]]] = {}
    if log.is_file():
        for line in log.read_text(encoding="utf-8").splitlines():
            try:
                record = json.loads(line)
                results.setdefault(record["check"], []).append((record["status"], record.get("message", "")))
            except (ValueError, KeyError, TypeError):
                continue  # a torn line from a kernel killed mid-write
    return results


def _outcomes(checks: list[str], results: dict[str, list[tuple[str, str]]]) -> tuple[CheckResult, ...]:
    """One outcome per expected check: it passes if every call of it passed; otherwise its
    first call that did not pass speaks for it."""
    outcomes = []
    for name in checks:
        calls = results.get(name, [])
        failed = [call for call in calls if call[0] != "pass"]
        status, message = failed[0] if failed else calls[-1] if calls else ("not run", NOT_RUN)
        outcomes.append(CheckResult(name, status, message))
    return tuple(outcomes)


def write_csv(rows: list[Row], out: Path) -> None:
    """The long gradebook: one line per student and exercise, :data:`COLUMNS`."""
    with open(out, "w", newline="", encoding="utf-8") as stream:
        writer = csv.writer(stream)
        writer.writerow(COLUMNS)
        writer.writerows([getattr(row, column) for column in COLUMNS] for row in rows)
