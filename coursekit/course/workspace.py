"""The student's working copy: the notebooks and exercises a student runs and edits, outside git.

Running a notebook saves its outputs into the file it runs. If that file is the course's own
(tracked by git), the next ``git pull`` of a course update conflicts. So students work in
``workspace/`` (ignored by git): ``make lab`` creates it, copying what is missing and never
overwriting, and ``make update`` pulls the course, then merges the course's changes into the
student's copies, cell by cell, the way git merges lines (a three-way merge)::

    base    the course's notebook when the copy was made or last updated  (workspace/.course/)
    mine    the student's copy                                            (workspace/)
    theirs  the course's notebook now                                     (notebooks/, exercises/)

Cells are compared by type and source only, so running a notebook is not an edit. Between the
cells all three share, a run of cells takes

* the course's new version, where the student left the run as it was in ``base``;
* the student's version, where the course did not change it;
* the student's version, where both changed it: a *conflict*. The course's whole new notebook
  is then written beside the copy as ``NAME.course.ipynb``, and the report names it.

A copy without a base (one made by hand) that differs from the course's is a conflict as a
whole: it is left as it is. A copy the student deleted is copied afresh (so deleting a copy resets it); a course notebook
that is new is copied in; a copy the course no longer has is left alone. Every file is
replaced atomically, and a copy's cells the course did not change keep their outputs.

Usage::

    coursekit workspace init   [--course DIR] [--workspace DIR]   # make lab runs this
    coursekit workspace update [--course DIR] [--workspace DIR]   # make update runs this
"""

from __future__ import annotations

import argparse
import copy
import difflib
import os
import shutil
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import nbformat
from nbformat.corpus.words import generate_corpus_id

from coursekit.course import notebooks as nb

FOLDERS = ("notebooks", "exercises")  # what a student works in, relative to the course root
SNAPSHOTS = ".course"  # inside the workspace: each copy's base, the course's version last merged
CONFLICT_SUFFIX = ".course.ipynb"


class WorkspaceError(ValueError):
    """A course or workspace folder the working copy cannot use."""


@dataclass
class Report:
    """What ``init`` or ``update`` did, each entry a path relative to the workspace."""

    copied: list[str] = field(default_factory=list)  # new in the workspace
    updated: list[str] = field(default_factory=list)  # the course's changes merged in
    unchanged: list[str] = field(default_factory=list)  # nothing new from the course
    conflicts: list[tuple[str, str]] = field(default_factory=list)  # (copy, the course's version beside it)

    def lines(self) -> list[str]:
        lines = [f"copied {name}" for name in self.copied]
        lines += [f"updated {name} (your changes kept)" for name in self.updated]
        lines += [f"CONFLICT {name}: you and the course changed the same cells; yours are kept, "
                  f"the course's new version is {beside}" for name, beside in self.conflicts]
        lines.append(f"{len(self.copied)} copied, {len(self.updated)} updated, "
                     f"{len(self.conflicts)} conflicts, {len(self.unchanged)} unchanged")
        return lines


def course_notebooks(course: Path) -> dict[str, Path]:
    """The notebooks a student works on: ``notebooks/*.ipynb`` and ``exercises/*.ipynb``."""
    found = {f"{folder}/{path.name}": path
             for folder in FOLDERS for path in sorted((course / folder).glob("*.ipynb"))}
    if not found:
        raise WorkspaceError(f"{course} has no notebooks/*.ipynb or exercises/*.ipynb: "
                             "--course must be the course's folder (the one with the Makefile)")
    return found


def check_folders(course: Path, workspace: Path) -> None:
    """Refuse a workspace that would write into the course's own (git-tracked) folders."""
    course, workspace = course.resolve(), workspace.resolve()
    for folder in FOLDERS:
        tracked = course / folder
        if workspace == tracked or tracked in workspace.parents or workspace in tracked.parents:
            raise WorkspaceError(f"workspace {workspace} overlaps the course's {tracked}; "
                                 "choose a folder outside notebooks/ and exercises/ (default: workspace/)")


def init(course: Path = nb.ROOT, workspace: Path | None = None) -> Report:
    """Copy every course notebook the workspace lacks; never touch a copy that exists."""
    workspace = _default(course, workspace)
    check_folders(course, workspace)
    report = Report()
    for name, path in course_notebooks(course).items():
        if (workspace / name).exists():
            report.unchanged.append(name)
        else:
            _copy_in(path, workspace, name)
            report.copied.append(name)
    return report


def update(course: Path = nb.ROOT, workspace: Path | None = None) -> Report:
    """Merge the course's current notebooks into the workspace's copies (module docstring)."""
    workspace = _default(course, workspace)
    check_folders(course, workspace)
    report = Report()
    for name, path in course_notebooks(course).items():
        mine_path, base_path = workspace / name, workspace / SNAPSHOTS / name
        if not mine_path.exists():
            _copy_in(path, workspace, name)
            report.copied.append(name)
            continue
        theirs = nbformat.read(path, as_version=4)
        mine = nbformat.read(mine_path, as_version=4)
        if base_path.exists():
            base = nbformat.read(base_path, as_version=4)
            if _keys(base.cells) == _keys(theirs.cells):
                report.unchanged.append(name)
                continue
            cells, conflicted = merge_cells(base.cells, mine.cells, theirs.cells)
            merged = copy.deepcopy(theirs)
            merged.cells = _unique_ids(cells)
            _write(merged, mine_path)
        else:  # a copy without its base (made by hand): which side changed what is unknown
            conflicted = _keys(mine.cells) != _keys(theirs.cells)
            if not conflicted:
                report.unchanged.append(name)
        if conflicted:
            beside = mine_path.with_name(mine_path.name.removesuffix(".ipynb") + CONFLICT_SUFFIX)
            _write(theirs, beside)
            report.conflicts.append((name, str(beside.relative_to(workspace))))
        elif base_path.exists():
            report.updated.append(name)
        _write(theirs, base_path)
    return report


def merge_cells(base: list, mine: list, theirs: list) -> tuple[list, bool]:
    """Three-way merge of cell lists; return the merged cells and whether a run conflicted.

    Anchors are the ``base`` cells that both ``mine`` and ``theirs`` kept (the same type and
    source, matched in order by :class:`difflib.SequenceMatcher`); an anchor is taken from
    ``mine`` (with the student's outputs). Each run of cells between two anchors is resolved as
    the module docstring says, cell by cell where no side inserted or removed a cell there; a
    conflicting run keeps ``mine``'s cells."""
    base_keys = _keys(base)
    to_mine, to_theirs = _matches(base_keys, _keys(mine)), _matches(base_keys, _keys(theirs))
    anchors = [i for i in range(len(base)) if i in to_mine and i in to_theirs]
    merged, conflicted = [], False
    previous = (-1, -1, -1)
    for b, m, t in [(i, to_mine[i], to_theirs[i]) for i in anchors] + [(len(base), len(mine), len(theirs))]:
        runs = base[previous[0] + 1:b], mine[previous[1] + 1:m], theirs[previous[2] + 1:t]
        if len(set(map(len, runs))) == 1:  # cells edited in place: each position is a run of its own
            runs = [([cell_base], [cell_mine], [cell_theirs]) for cell_base, cell_mine, cell_theirs in zip(*runs)]
        else:
            runs = [runs]
        for run_base, run_mine, run_theirs in runs:
            cells, clash = _resolve(run_base, run_mine, run_theirs)
            merged += cells
            conflicted |= clash
        if b < len(base):
            merged.append(mine[m])
        previous = (b, m, t)
    return [copy.deepcopy(cell) for cell in merged], conflicted


def _resolve(run_base: list, run_mine: list, run_theirs: list) -> tuple[list, bool]:
    """One run between anchors: the side that changed it wins; if both did, differently, mine."""
    if _keys(run_mine) == _keys(run_base):
        return run_theirs, False
    return run_mine, _keys(run_theirs) not in (_keys(run_base), _keys(run_mine))


def _keys(cells: list) -> list[tuple[str, str]]:
    return [(cell.cell_type, cell.source) for cell in cells]


def _matches(a: list, b: list) -> dict[int, int]:
    """Index in ``a`` -> index in ``b`` of the elements the longest matching blocks pair."""
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return {block.a + k: block.b + k for block in matcher.get_matching_blocks() for k in range(block.size)}


def _unique_ids(cells: list) -> list:
    """A merge can bring two cells with one id (the course numbers its cells): renew the later."""
    seen = set()
    for cell in cells:
        if cell.get("id") in seen:
            cell.id = generate_corpus_id()
        seen.add(cell.get("id"))
    return cells


def _default(course: Path, workspace: Path | None) -> Path:
    return Path(course) / "workspace" if workspace is None else Path(workspace)


def _copy_in(path: Path, workspace: Path, name: str) -> None:
    for target in (workspace / name, workspace / SNAPSHOTS / name):
        target.parent.mkdir(parents=True, exist_ok=True)
        _replace_with(target, lambda tmp: shutil.copyfile(path, tmp))


def _write(notebook, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    _replace_with(target, lambda tmp: nbformat.write(notebook, tmp))


def _replace_with(target: Path, fill) -> None:
    """Write through a temporary file in the same folder, then rename: never half a notebook."""
    handle, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    os.close(handle)
    try:
        fill(tmp)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="coursekit workspace", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=("init", "update"),
                        help="init: copy what is missing; update: merge the course's changes in")
    parser.add_argument("--course", type=Path, default=nb.ROOT, help="the course's folder (default: this one)")
    parser.add_argument("--workspace", type=Path, help="the working copy (default: COURSE/workspace)")
    args = parser.parse_args(argv)
    try:
        report = (init if args.command == "init" else update)(args.course, args.workspace)
    except WorkspaceError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print("\n".join(report.lines()))
    return 0
