"""Build the course notebooks from their sources; generate the exercises.

Notebooks are never edited as JSON. Each one has a percent-format source::

    notebooks/src/00_setup.py    ->  notebooks/00_setup.ipynb
    solutions/src/00_latency.py  ->  solutions/00_latency.ipynb  ->  exercises/00_latency.ipynb

A source is a Python file whose cells start with a cell marker line, in jupytext's
percent format::

    # %%                                 a code cell
    # %% [markdown]                      a markdown cell, each of its lines a "# " comment
    # %% tags=["nbval-ignore-output"]    a code cell with nbval's tags: a JSON list of
                                         nbval-ignore-output, nbval-check-output,
                                         nbval-raises-exception, nbval-skip

Only blank lines and the ``# ---`` header of notebook metadata that jupytext writes (which
the builder ignores) may come before the first marker; an empty code cell is dropped.
jupytext reads each course source as the same cells, and a source it writes back from
the notebook builds the same notebook, so a JupyterLab user with jupytext can open a
source as a notebook and save it. The builder refuses, naming the file and line, every
other line that jupytext could read as a cell marker (``# %%[markdown]``, ``#%%``,
``# %% [md]``, a title, other metadata, malformed JSON, a tag that is not nbval's) and
nbval's ``# NBVAL_IGNORE_OUTPUT`` comment lines.

``execute`` converts a source, runs it top to bottom in a fresh kernel and stores the
notebook with its outputs (nbval later re-runs it and compares). Solution notebooks mark
the student's part with nbgrader's ``### BEGIN SOLUTION`` / ``### END SOLUTION`` lines,
a ``# Hint: ...`` line just above the first one giving the hint; ``exercises`` replaces
each marked block (and its hint line) by a stub that says the hint and raises
``NotImplementedError``, and writes the exercise without outputs. The solution notebooks
also carry nbgrader's cell metadata (:mod:`coursekit.course.nbgrader_cells`).

Usage::

    coursekit notebooks execute [PATH ...]   # sources or notebooks; default: all
    coursekit notebooks exercises            # regenerate exercises/ from solutions/
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[2]
SOURCE_FOLDERS = ("notebooks", "solutions")
# the cell markers the builder reads (jupytext's spelling): '# %%', '# %% [markdown]',
# '# %% tags=[...]'
CELL_MARKER = re.compile(r"^# %%(?: (?P<markdown>\[markdown\])| tags=(?P<tags>.*?))?\s*$")
# every line jupytext may read as a cell's start (jupytext's cell_reader.py): a cell marker,
# or an error where CELL_MARKER does not match it
MARKER_LIKE = re.compile(r"^\s*#\s*(?:%%|<codecell>\s*$|In\[[0-9 ]*\]:?\s*$)")
# nbval's tags, the only cell metadata a source carries: the first line a student reads in
# a cell is code, not nbval's "# NBVAL_IGNORE_OUTPUT" comment, which the builder refuses
NBVAL_TAGS = ("nbval-ignore-output", "nbval-check-output", "nbval-raises-exception", "nbval-skip")
OLD_NBVAL_MARKER = re.compile(r"^\s*#\s*NBVAL_(?P<name>\w+)\s*$")
# what may come before the first marker: blank lines and jupytext's YAML header
PREAMBLE = re.compile(r"(?:[ \t]*\n)*(?:# ---\n(?:#.*\n)*?# ---\n(?:[ \t]*\n)*)?")
MARKERS_ALLOWED = (
    "a cell starts with '# %%', '# %% [markdown]' or '# %% tags=[...]', a JSON list of "
    + ", ".join(f'"{tag}"' for tag in NBVAL_TAGS)
)
BEGIN = re.compile(r"^(?P<indent>[ \t]*)### BEGIN SOLUTION(?P<after>.*?)\s*$")
END = re.compile(r"^[ \t]*### END SOLUTION\s*$")
# a block's hint: a comment line just above its BEGIN SOLUTION, indented as it is (nbgrader's
# release keeps that line; it drops any text after BEGIN SOLUTION, which the builder refuses)
HINT = re.compile(r"^(?P<indent>[ \t]*)# Hint: (?P<hint>.+?)\s*$")
CELL_TIMEOUT_S = 300
# tqdm's text form ("steps: 0it [00:00, ?it/s]", " 40%|####  | 4/10"): what a progress bar
# left in a stored notebook shows before it runs; bars are transient, never stored
PROGRESS_BAR = re.compile(r"\d+it \[\d\d:\d\d|\d+%\|")
# ipywidgets' own repr ("VBox(children=(HBox(...", "IntSlider(value=3"): what a widget with
# no readable fallback shows before its notebook runs; never in a stored or shown output
RAW_WIDGET_REPR = re.compile(r"^\w+\((children|value)=", re.MULTILINE)


class NotebookError(ValueError):
    """A source or notebook path that cannot be built, with what to do instead."""


# --------------------------------------------------------------------------- sources


def parse_source(text: str, name: str = "source") -> nbformat.NotebookNode:
    """Turn a percent-format source into an (unexecuted) notebook.

    A line the builder does not read as jupytext does raises NotebookError, naming
    ``name`` and the line: ``source:12: ...``.
    """
    cells, kind, tags, lines = [], None, [], []

    def flush():
        body = "\n".join(lines).strip("\n")
        if kind == "markdown":
            body = "\n".join(re.sub(r"^# ?", "", line) for line in body.split("\n"))
            cells.append(nbformat.v4.new_markdown_cell(body))
        elif body.strip():
            cells.append(nbformat.v4.new_code_cell(body, metadata={"tags": tags} if tags else {}))

    preamble = PREAMBLE.match(text).end()
    first = text[:preamble].count("\n") + 1
    if not MARKER_LIKE.match(text[preamble:].partition("\n")[0]):
        raise NotebookError(f"{name}:{first}: a notebook source must start with a '# %%' cell "
                            "marker (after blank lines and jupytext's '# ---' header)")
    for number, line in enumerate(text[preamble:].splitlines(), first):
        if MARKER_LIKE.match(line):
            flush()
            kind, tags, lines = *cell_marker(line, f"{name}:{number}"), []
        elif OLD_NBVAL_MARKER.match(line):
            tag = OLD_NBVAL_MARKER.match(line)["name"].lower().replace("_", "-")
            raise NotebookError(f"{name}:{number}: nbval's comment {line.strip()!r} is not read: "
                                f"tag the cell instead, '# %% tags=[\"nbval-{tag}\"]'")
        else:
            lines.append(line)
    flush()
    notebook = nbformat.v4.new_notebook(cells=cells)
    notebook.metadata.update(
        kernelspec={"name": "python3", "display_name": "Python 3", "language": "python"},
        language_info={"name": "python"},
    )
    for index, cell in enumerate(notebook.cells):
        cell.id = f"cell-{index:03d}"  # stable ids: rebuilding gives the same JSON
    return notebook


def build(source: Path) -> nbformat.NotebookNode:
    """The (unexecuted) notebook of a source file; a solution's carries nbgrader's cell metadata."""
    notebook = parse_source(source.read_text(), name=str(source))
    if source.parent.parent.name == "solutions":
        from coursekit.course import nbgrader_cells  # it builds on this module

        nbgrader_cells.mark(notebook, name=str(source))
    return notebook


def cell_marker(line: str, where: str) -> tuple[str, list[str]]:
    """The kind ("code" or "markdown") and nbval tags of a cell marker line."""
    marker = CELL_MARKER.match(line)
    if marker is None:
        raise NotebookError(f"{where}: {line.strip()!r} is not a cell marker the builder reads: "
                            f"{MARKERS_ALLOWED}")
    if marker["markdown"]:
        return "markdown", []
    if marker["tags"] is None:
        return "code", []
    try:
        tags = json.loads(marker["tags"])
    except json.JSONDecodeError:
        tags = None
    if not (isinstance(tags, list) and tags and all(tag in NBVAL_TAGS for tag in tags)):
        raise NotebookError(f"{where}: tags={marker['tags']} is not a list of nbval's tags: "
                            f"{MARKERS_ALLOWED}")
    return "code", tags


def notebook_for(source: Path) -> Path:
    """``notebooks/src/X.py`` -> ``notebooks/X.ipynb``."""
    return source.parent.parent / (source.stem + ".ipynb")


def source_for(notebook: Path) -> Path:
    """``notebooks/X.ipynb`` -> ``notebooks/src/X.py``."""
    return notebook.parent / "src" / (notebook.stem + ".py")


def all_sources(root: Path = ROOT) -> list[Path]:
    return sorted(p for folder in SOURCE_FOLDERS for p in (root / folder / "src").glob("*.py"))


def resolve(path: str | Path, root: Path = ROOT) -> Path:
    """The source behind a path that names a source or a built notebook."""
    path = Path(path)
    candidates = [path, root / path] if not path.is_absolute() else [path]
    for candidate in candidates:
        if candidate.suffix == ".ipynb":
            candidate = source_for(candidate)
        if candidate.suffix == ".py" and candidate.is_file() and candidate.parent.name == "src":
            return candidate.resolve()
    known = ", ".join(str(p.relative_to(root)) for p in all_sources(root)) or "none"
    raise NotebookError(
        f"no notebook source for {str(path)!r}: give a notebooks/src/*.py or solutions/src/*.py "
        f"file or the .ipynb built from one (known: {known})"
    )


# --------------------------------------------------------------------------- execution


def execute(source: Path, timeout: int = CELL_TIMEOUT_S) -> Path:
    """Run a source in a fresh kernel; store the notebook (and exercise) with outputs."""
    from nbclient import NotebookClient

    notebook = build(source)
    target = notebook_for(source)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="coursekit-ipython-") as ipython_dir:
        saved = os.environ.get("IPYTHONDIR")
        os.environ["IPYTHONDIR"] = ipython_dir  # the kernel's clusters stay in here
        os.environ["COURSEKIT_STRICT_FIGURES"] = "1"  # a figure that breaks the rules fails the build
        try:
            NotebookClient(
                notebook,
                timeout=timeout,
                kernel_name="python3",
                resources={"metadata": {"path": str(target.parent)}},
            ).execute()
        finally:
            if saved is None:
                os.environ.pop("IPYTHONDIR")
            else:
                os.environ["IPYTHONDIR"] = saved
            from coursekit.cluster.processes import end_cluster_processes

            end_cluster_processes(ipython_dir)
    drop_progress_bars(notebook)
    nbformat.write(notebook, target)
    print(f"executed {target.relative_to(ROOT)} in {time.monotonic() - started:.1f} s")
    if target.parent.name == "solutions":
        write_exercise(target)
    return target


def off_host_numerics() -> dict[str, str]:
    """Environment variables under which a fresh process computes as another machine would.

    Stored outputs are compared as text on every student's and CI's machine, so they must
    not depend on this CPU. Two things here change floating-point bits from one CPU to the
    next: NumPy picks SIMD kernels for float32 ``exp``, ``tanh``, ``log``, sums ... at run
    time (AVX-512 on one machine, AVX2 on another, NEON on ARM; their results differ in the
    last bits), and Numba compiles for the host CPU. Under these variables a process uses
    NumPy's baseline kernels (``NPY_DISABLE_CPU_FEATURES`` names every dispatched feature
    this CPU has) and Numba's generic target (``NUMBA_CPU_NAME=generic``).
    ``pytest --numerics=off-host`` (what ``make test`` passes) starts the notebooks'
    kernels, and so their engines, under them. OpenBLAS's kernel choice is left alone:
    some processors need the ``OPENBLAS_CORETYPE`` their machine sets.
    """
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__

    dispatched = [feature for feature in __cpu_dispatch__ if __cpu_features__.get(feature)]
    return {"NUMBA_CPU_NAME": "generic", "NPY_DISABLE_CPU_FEATURES": " ".join(dispatched)}


def drop_progress_bars(notebook: nbformat.NotebookNode) -> None:
    """Remove progress-bar outputs (tqdm widgets) from every code cell."""
    for cell in notebook.cells:
        if cell.cell_type == "code":
            cell.outputs = [o for o in cell.outputs
                            if not PROGRESS_BAR.search(_plain_text(o))]


def _plain_text(output) -> str:
    text = output.get("data", {}).get("text/plain", "")
    return "".join(text) if isinstance(text, list) else text


# --------------------------------------------------------------------------- exercises


def strip_solutions(text: str) -> str:
    """Replace every BEGIN/END SOLUTION block of a code cell by a stub that raises
    NotImplementedError (a block in a markdown cell is refused when the solution is built:
    :mod:`coursekit.course.nbgrader_cells`)."""
    out, inside = [], False
    for number, line in enumerate(text.split("\n"), 1):
        begin = BEGIN.match(line)
        if begin and inside:
            raise NotebookError(f"line {number}: BEGIN SOLUTION inside another solution block")
        if begin and begin["after"]:
            raise NotebookError(f"line {number}: text after BEGIN SOLUTION ({begin['after'].strip()!r}) is "
                                "lost in nbgrader's release: write it as a '# Hint: ...' line just above")
        if begin:
            hint = HINT.match(out[-1]) if out else None
            hint = hint["hint"] if hint and hint["indent"] == begin["indent"] else ""
            if hint:
                out.pop()  # the stub says it
            inside = True
            out += stub_lines(begin["indent"], hint)
        elif END.match(line):
            if not inside:
                raise NotebookError(f"line {number}: END SOLUTION without BEGIN SOLUTION")
            inside = False
        elif not inside:
            out.append(line)
    if inside:
        raise NotebookError("a BEGIN SOLUTION block has no END SOLUTION")
    return "\n".join(out)


def solution_blocks(text: str) -> list[str]:
    """The lines inside each BEGIN/END SOLUTION block (markers validated by strip_solutions)."""
    blocks, inside = [], None
    for line in text.split("\n"):
        if BEGIN.match(line):
            inside = []
        elif END.match(line) and inside is not None:
            blocks.append("\n".join(inside))
            inside = None
        elif inside is not None:
            inside.append(line)
    return blocks


def stub_lines(indent: str, hint: str) -> list[str]:
    task = hint or "write this part"
    return [f"{indent}# YOUR CODE HERE: {task}", f"{indent}raise NotImplementedError({task!r})"]


def exercise_from(solution: nbformat.NotebookNode) -> nbformat.NotebookNode:
    """The exercise: solution blocks stubbed out, code outputs cleared."""
    exercise = nbformat.from_dict(solution)
    for cell in exercise.cells:
        if cell.cell_type == "code":
            cell.source = strip_solutions(cell.source)
            cell.outputs, cell.execution_count = [], None
    return exercise


def exercise_path(solution: Path) -> Path:
    return solution.parent.parent / "exercises" / solution.name


def write_exercise(solution: Path) -> Path:
    target = exercise_path(solution)
    target.parent.mkdir(exist_ok=True)
    nbformat.write(exercise_from(nbformat.read(solution, as_version=4)), target)
    print(f"generated {target.relative_to(ROOT)}")
    return target


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="coursekit notebooks", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("execute", help="run sources in a fresh kernel and store the notebooks")
    run.add_argument("paths", nargs="*", help="sources or notebooks (default: all)")
    run.add_argument("--timeout", type=int, default=CELL_TIMEOUT_S, help="seconds per cell")
    commands.add_parser("exercises", help="regenerate exercises/ from solutions/*.ipynb")
    args = parser.parse_args(argv)
    try:
        if args.command == "execute":
            sources = [resolve(p) for p in args.paths] or all_sources()
            for source in sources:
                execute(source, timeout=args.timeout)
        else:
            for solution in sorted((ROOT / "solutions").glob("*.ipynb")):
                write_exercise(solution)
    except NotebookError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
