"""Hand the course to students without its solutions; grade what they hand back.

The repository keeps ``solutions/`` next to ``exercises/``, so it cannot be given
to students as it is. ``student`` writes a folder they can use instead::

    notebooks/*.ipynb     the chapter notebooks, with their stored outputs
    exercises/*.ipynb     generated from solutions/ (solution blocks stubbed out)
    coursekit/            the course library (the notebooks import it; see below)
    pyproject.toml, constraints.txt, Makefile, README.md   ``make lab`` installs it (the
                          pinned versions the stored outputs came from) and opens JupyterLab

and then verifies it: every notebook and exercise is there, no file holds a solution
marker, no solution block's code appears anywhere, and nothing from ``solutions/``,
``tests/`` or a notebook source (``src/``) was copied. The library ships whole: it is
the lecture material, and the checks in ``coursekit/grading`` compare the student's
function with the library's own reference functions (e.g. ``nn.reference.layer_backward``,
``parallel.param_server.consistency.ssp_gate``), which a student could call instead of writing
the exercise; grading counts checks, it cannot tell.

Usage::

    coursekit release student OUTDIR [--force]
    coursekit release nbgrader OUTDIR [--force]
    coursekit release grade SUBMISSIONS --out gradebook.csv [--timeout 300] [--exercises DIR]
                            [--lms canvas|moodle] [--feedback FOLDER]

``nbgrader`` writes an nbgrader course directory: every exercise an assignment of its own,
its source the solution notebook (README, "Grading with nbgrader"). ``--lms`` writes
``--out`` as the gradebook that LMS imports (:mod:`coursekit.course.lms`) instead of the long
CSV; ``--feedback`` writes one file per student (:mod:`coursekit.course.feedback`).
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

import nbformat

from coursekit.course import notebooks as nb

TEMPLATES = nb.ROOT / "release" / "student"  # the student's Makefile and README
NBGRADER_CONFIG = nb.ROOT / "release" / "nbgrader" / "nbgrader_config.py"
FORBIDDEN_FOLDERS = {"solutions", "tests", "src"}
CACHES = shutil.ignore_patterns("__pycache__", "*.pyc", "*.nbi", "*.nbc", ".ipynb_checkpoints")


class ReleaseError(ValueError):
    """A release folder that cannot be written, or one that would leak solutions."""


def solutions(root: Path = nb.ROOT) -> list[Path]:
    return sorted((root / "solutions").glob("*.ipynb"))


def chapter_notebooks(root: Path = nb.ROOT) -> list[Path]:
    return sorted((root / "notebooks").glob("*.ipynb"))


def write_student_release(out: Path, force: bool = False, root: Path = nb.ROOT) -> Path:
    """Write the student folder ``out`` and verify it; refuse a non-empty ``out`` unless ``force``
    (which writes over existing files and keeps others, so verification still sees them)."""
    out = _writable_folder(out, force, "the student release")
    (out / "notebooks").mkdir(parents=True, exist_ok=True)
    (out / "exercises").mkdir(exist_ok=True)
    for notebook in chapter_notebooks(root):
        shutil.copyfile(notebook, out / "notebooks" / notebook.name)
    for solution in solutions(root):
        nbformat.write(nb.exercise_from(nbformat.read(solution, as_version=4)), out / "exercises" / solution.name)
    shutil.copytree(root / "coursekit", out / "coursekit", ignore=CACHES, dirs_exist_ok=True)
    for name in ("pyproject.toml", "constraints.txt"):  # the versions the stored outputs came from
        shutil.copyfile(root / name, out / name)
    for template in ("Makefile", "README.md"):
        shutil.copyfile(TEMPLATES / template, out / template)
    verify_release(out, root)
    return out


def write_nbgrader_course(out: Path, force: bool = False, root: Path = nb.ROOT) -> Path:
    """Write the nbgrader course directory ``out``: the course's ``nbgrader_config.py`` and each
    solution notebook (with its nbgrader cell metadata) as an assignment of its own,
    ``source/<exercise>/<exercise>.ipynb``. Refuses a non-empty ``out`` unless ``force``."""
    out = _writable_folder(out, force, "the nbgrader course")
    for solution in solutions(root):
        (out / "source" / solution.stem).mkdir(parents=True, exist_ok=True)
        shutil.copyfile(solution, out / "source" / solution.stem / solution.name)
    shutil.copyfile(NBGRADER_CONFIG, out / "nbgrader_config.py")
    return out


def _writable_folder(out: Path, force: bool, what: str) -> Path:
    """``out`` as a Path, if it is a new or empty folder (or ``force``); else ReleaseError."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise ReleaseError(f"{out} is a file; give a folder to write {what} into")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ReleaseError(f"{out} is not empty; give an empty or new folder, or --force to write over it")
    out.mkdir(parents=True, exist_ok=True)
    return out


def verify_release(folder: Path, root: Path = nb.ROOT) -> None:
    """Raise :class:`ReleaseError` listing every problem: a missing notebook or exercise, a
    solution marker, a solution block's code, or a file from solutions/, tests/ or src/."""
    folder = Path(folder)
    problems = []
    for kind, expected in (("notebooks", chapter_notebooks(root)), ("exercises", solutions(root))):
        problems += [f"{kind}/{p.name} is missing" for p in expected if not (folder / kind / p.name).is_file()]
    blocks = {(s.name, b): _normalized(b) for s in solutions(root)
              for cell in nbformat.read(s, as_version=4).cells for b in nb.solution_blocks(cell.source)}
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        name = path.relative_to(folder)
        if FORBIDDEN_FOLDERS & set(name.parts[:-1]):
            problems.append(f"{name} comes from a folder students must not get ({', '.join(sorted(FORBIDDEN_FOLDERS))})")
        try:
            text = path.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue  # binary: cannot hold a notebook's text
        if path.suffix == ".ipynb":
            if "### BEGIN SOLUTION" in text or "### END SOLUTION" in text:
                problems.append(f"{name} holds a solution marker")
            text = "\n".join(c.source for c in nbformat.reads(text, as_version=4).cells)
        elif any(nb.BEGIN.match(line) or nb.END.match(line) for line in text.split("\n")):
            problems.append(f"{name} holds a solution marker line")
        flat = _normalized(text)
        problems += [f"{name} holds the solution code of {solution}" for (solution, _), block in blocks.items()
                     if block and block in flat]
    if problems:
        raise ReleaseError(f"the student release {folder} is not safe to hand out:\n  " + "\n  ".join(problems))


def _normalized(text: str) -> str:
    """Lines stripped, blank lines dropped: finds copied code whatever its indentation."""
    return "\n".join(line.strip() for line in text.split("\n") if line.strip())


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    from coursekit.course import gradebook, lms

    parser = argparse.ArgumentParser(prog="coursekit release", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    student = commands.add_parser("student", help="write a student folder without solutions, and verify it")
    student.add_argument("outdir", type=Path)
    student.add_argument("--force", action="store_true", help="write into a non-empty folder")
    nbgrader = commands.add_parser("nbgrader", help="write an nbgrader course directory: every exercise an "
                                                     "assignment, its source the solution notebook")
    nbgrader.add_argument("outdir", type=Path)
    nbgrader.add_argument("--force", action="store_true", help="write into a non-empty folder")
    grade = commands.add_parser("grade", help="run every student's exercise notebooks; write a CSV gradebook")
    grade.add_argument("submissions", type=Path, help="one subfolder per student (its name is the student id)")
    grade.add_argument("--out", type=Path, required=True, help="the CSV file to write")
    grade.add_argument("--lms", choices=sorted(lms.WRITERS),
                       help="write --out as this LMS's gradebook import (one line per student) "
                            "instead of one line per student and exercise")
    grade.add_argument("--feedback", type=Path, metavar="FOLDER",
                       help="also write FOLDER/<student>.md: each exercise's score and what its checks said")
    grade.add_argument("--timeout", type=float, default=gradebook.TIMEOUT_S,
                       help=f"seconds per notebook (default {gradebook.TIMEOUT_S})")
    grade.add_argument("--exercises", type=Path, default=nb.ROOT / "exercises",
                       help="the exercises to expect and count checks in (default: exercises/)")
    args = parser.parse_args(argv)
    try:
        if args.command == "student":
            write_student_release(args.outdir, force=args.force)
            print(f"wrote {args.outdir}: {len(chapter_notebooks())} notebooks, {len(solutions())} "
                  "exercises, the coursekit library; verified: no solutions")
        elif args.command == "nbgrader":
            write_nbgrader_course(args.outdir, force=args.force)
            print(f"wrote {args.outdir}: nbgrader_config.py and source/ with {len(solutions())} assignments; "
                  f"next, there: nbgrader generate_assignment '*'")
        else:
            grade_class(args)
    except (ReleaseError, gradebook.GradingError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


def grade_class(args: argparse.Namespace) -> None:
    """``release grade``: grade every submission, write the gradebook (long, or for
    ``args.lms``) and, with ``args.feedback``, a feedback file per student."""
    from coursekit.course import feedback, gradebook, lms

    if args.feedback:
        feedback.prepare_folder(args.feedback)  # a bad folder fails now, not after grading
    rows = gradebook.grade(args.submissions, args.exercises, timeout=args.timeout, progress=print)
    if args.lms:
        lms.WRITERS[args.lms](rows, args.out)
        possible = ", ".join(f"{name} {points}" for name, points in lms.points_possible(rows).items())
        print(f"wrote {args.out} for {args.lms}: {len({row.student for row in rows})} students; "
              f"points possible: {possible}")
    else:
        gradebook.write_csv(rows, args.out)
        print(f"wrote {args.out}: {len(rows)} rows")
    if args.feedback:
        print(f"wrote {len(feedback.write_feedback(rows, args.feedback))} feedback files in {args.feedback}")


if __name__ == "__main__":
    sys.exit(main())
