"""The student's working copy (coursekit.course.workspace): course updates that merge.

The end-to-end test is the student's own sequence with real git: clone the course, make the
working copy, run and edit notebooks, the instructor pushes an update, ``git pull``, update.
"""

import shlex
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from coursekit.course import workspace as ws

ROOT = Path(__file__).resolve().parents[1]


def code(source, output=None):
    cell = new_code_cell(source)
    if output is not None:
        cell.outputs = [new_output("stream", name="stdout", text=output)]
    return cell


def sources(cells):
    return [cell.source for cell in cells]


def chapter(*cells):
    notebook = new_notebook(cells=list(cells))
    for index, cell in enumerate(notebook.cells):
        cell.id = f"cell-{index:03d}"  # as the course's builder numbers them
    return notebook


# ---- the merge, cell by cell ------------------------------------------------------------------

def test_a_cell_the_course_changed_is_taken_and_a_cell_the_student_edited_is_kept():
    base = [new_markdown_cell("# 03"), code("a = 1"), code("b = 2"), code("c = 3")]
    mine = [new_markdown_cell("# 03"), code("a = 1"), code("b = 2  # my note"), code("c = 3")]
    theirs = [new_markdown_cell("# 03"), code("a = 10"), code("b = 2"), code("c = 3")]
    merged, conflicted = ws.merge_cells(base, mine, theirs)
    assert sources(merged) == ["# 03", "a = 10", "b = 2  # my note", "c = 3"]
    assert not conflicted


def test_running_a_notebook_is_not_an_edit_and_unchanged_cells_keep_the_students_outputs():
    base = [code("x = 1"), code("print(x)"), code("y = 2")]
    mine = [code("x = 1", "ran"), code("print(x)", "1\n"), code("y = 2", "ran")]
    theirs = [code("x = 1"), code("print(x + 1)"), code("y = 2")]
    merged, conflicted = ws.merge_cells(base, mine, theirs)
    assert sources(merged) == ["x = 1", "print(x + 1)", "y = 2"]
    assert merged[0].outputs[0].text == "ran" and merged[1].outputs == []  # the changed cell: the course's
    assert not conflicted


def test_cells_added_on_both_sides_in_different_places_are_all_kept_in_order():
    base = [code("a"), code("b"), code("c")]
    mine = [code("a"), code("mine after a"), code("b"), code("c")]
    theirs = [code("a"), code("b"), code("c"), code("course's new section")]
    merged, conflicted = ws.merge_cells(base, mine, theirs)
    assert sources(merged) == ["a", "mine after a", "b", "c", "course's new section"]
    assert not conflicted


def test_a_cell_the_course_removed_goes_unless_the_student_edited_it():
    base = [code("a"), code("old"), code("c"), code("old 2")]
    mine = [code("a"), code("old"), code("c"), code("old 2, edited")]
    theirs = [code("a"), code("c")]
    merged, conflicted = ws.merge_cells(base, mine, theirs)
    assert sources(merged) == ["a", "c", "old 2, edited"]
    assert conflicted  # the course removed what the student edited: both changed that run


def test_the_same_cell_changed_on_both_sides_is_a_conflict_that_keeps_the_students_version():
    base = [code("a"), code("lr = 0.1"), code("c")]
    mine = [code("a"), code("lr = 0.5"), code("c")]
    theirs = [code("a"), code("lr = 0.05"), code("c")]
    merged, conflicted = ws.merge_cells(base, mine, theirs)
    assert sources(merged) == ["a", "lr = 0.5", "c"] and conflicted
    same, conflicted = ws.merge_cells(base, mine, [code("a"), code("lr = 0.5"), code("c")])
    assert sources(same) == ["a", "lr = 0.5", "c"] and not conflicted  # both made the same change


# ---- init and update on folders ------------------------------------------------------------

@pytest.fixture
def course(tmp_path):
    root = tmp_path / "course"
    (root / "notebooks").mkdir(parents=True)
    (root / "exercises").mkdir()
    nbformat.write(chapter(new_markdown_cell("# 00"), code("x = 1")), root / "notebooks" / "00_setup.ipynb")
    nbformat.write(chapter(code("def f():\n    raise NotImplementedError"), code("check(f)")),
                   root / "exercises" / "00_ex.ipynb")
    return root


def test_init_copies_what_is_missing_and_never_overwrites(course, tmp_path):
    work = tmp_path / "work"
    report = ws.init(course, work)
    assert sorted(report.copied) == ["exercises/00_ex.ipynb", "notebooks/00_setup.ipynb"]
    mine = work / "notebooks" / "00_setup.ipynb"
    mine.write_text(mine.read_text().replace("x = 1", "x = 2"))
    again = ws.init(course, work)
    assert again.copied == [] and "x = 2" in mine.read_text()
    assert (work / ws.SNAPSHOTS / "notebooks" / "00_setup.ipynb").read_text() == \
        (course / "notebooks" / "00_setup.ipynb").read_text()


def test_update_merges_writes_a_conflict_beside_and_recopies_a_deleted_copy(course, tmp_path):
    work = tmp_path / "work"
    ws.init(course, work)
    setup, exercise = work / "notebooks" / "00_setup.ipynb", work / "exercises" / "00_ex.ipynb"
    mine = nbformat.read(exercise, as_version=4)
    mine.cells[0].source = "def f():\n    return 42"
    nbformat.write(mine, exercise)
    nbformat.write(chapter(code("def f():\n    raise NotImplementedError  # now with a hint"),
                           code("check(f)")), course / "exercises" / "00_ex.ipynb")
    nbformat.write(chapter(new_markdown_cell("# 00"), code("x = 1"), code("y = 2")),
                   course / "notebooks" / "00_setup.ipynb")
    report = ws.update(course, work)
    assert report.updated == ["notebooks/00_setup.ipynb"]
    assert report.conflicts == [("exercises/00_ex.ipynb", "exercises/00_ex.course.ipynb")]
    assert sources(nbformat.read(setup, as_version=4).cells) == ["# 00", "x = 1", "y = 2"]
    assert nbformat.read(exercise, as_version=4).cells[0].source == "def f():\n    return 42"
    assert "now with a hint" in (work / "exercises" / "00_ex.course.ipynb").read_text()
    nbformat.validate(nbformat.read(setup, as_version=4))  # unique ids after the merge
    # the base moved on: a second update has nothing new, and a deleted copy comes back
    assert sorted(ws.update(course, work).unchanged) == ["exercises/00_ex.ipynb", "notebooks/00_setup.ipynb"]
    setup.unlink()
    assert ws.update(course, work).copied == ["notebooks/00_setup.ipynb"]


def test_a_copy_made_by_hand_without_its_base_is_kept_whole(course, tmp_path):
    work = tmp_path / "work"
    (work / "notebooks").mkdir(parents=True)
    nbformat.write(chapter(new_markdown_cell("# 00"), code("x = 99")), work / "notebooks" / "00_setup.ipynb")
    report = ws.update(course, work)
    assert report.conflicts == [("notebooks/00_setup.ipynb", "notebooks/00_setup.course.ipynb")]
    assert "x = 99" in (work / "notebooks" / "00_setup.ipynb").read_text()


@pytest.mark.parametrize("inside", ["notebooks", "exercises", "notebooks/mine", "."])
def test_a_workspace_overlapping_the_course_folders_is_refused(course, inside):
    with pytest.raises(ws.WorkspaceError, match="overlaps the course's"):
        ws.init(course, course / inside)


def test_a_folder_without_notebooks_is_refused(tmp_path):
    with pytest.raises(ws.WorkspaceError, match="--course must be the course's folder"):
        ws.update(tmp_path, tmp_path / "work")


# ---- the student's sequence with real git ---------------------------------------------------

def git(cwd, *args):
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=60)


def coursekit_workspace(*args):
    return subprocess.run([sys.executable, "-m", "coursekit", "workspace", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # runs git and the coursekit command in processes of their own
def test_a_student_pulls_an_update_and_keeps_their_work(course, tmp_path):
    (course / ".gitignore").write_text("workspace/\n")
    assert git(course, "init", "-q", "-b", "main").returncode == 0
    git(course, "add", "-A")
    git(course, "commit", "-qm", "course")
    student = tmp_path / "student"
    assert git(tmp_path, "clone", "-q", str(course), str(student)).returncode == 0

    made = coursekit_workspace("init", "--course", str(student))
    assert made.returncode == 0 and "2 copied" in made.stdout
    copy = student / "workspace" / "notebooks" / "00_setup.ipynb"
    ran = nbformat.read(copy, as_version=4)  # the student runs the chapter and adds a cell
    ran.cells[1].outputs = [new_output("stream", name="stdout", text="ran\n")]
    ran.cells.append(code("print('my experiment')"))
    nbformat.write(ran, copy)

    update = chapter(new_markdown_cell("# 00, revised"), code("x = 1"))
    nbformat.write(update, course / "notebooks" / "00_setup.ipynb")
    git(course, "commit", "-qam", "update")

    assert git(student, "status", "--porcelain").stdout == ""  # the student touched no tracked file
    pulled = git(student, "pull", "--ff-only")
    assert pulled.returncode == 0, pulled.stderr
    merged = coursekit_workspace("update", "--course", str(student))
    assert merged.returncode == 0, merged.stderr
    assert "updated notebooks/00_setup.ipynb" in merged.stdout
    cells = nbformat.read(copy, as_version=4).cells
    assert sources(cells) == ["# 00, revised", "x = 1", "print('my experiment')"]
    assert cells[1].outputs[0].text == "ran\n"

    refused = coursekit_workspace("init", "--course", str(student), "--workspace", str(student / "notebooks"))
    assert refused.returncode == 2 and "overlaps the course's" in refused.stderr


@pytest.mark.parametrize("makefile", [ROOT / "Makefile", ROOT / "release" / "student" / "Makefile"])
def test_make_lab_opens_the_first_notebook_of_the_working_copy_and_make_update_merges_into_it(makefile, tmp_path):
    folder = tmp_path / "course"  # the Makefile's folder, with the files its install rule needs
    folder.mkdir()
    (folder / "Makefile").write_text(makefile.read_text())
    for name in ("pyproject.toml", "constraints.txt"):
        (folder / name).write_text((ROOT / name).read_text())

    def dry_run(target):
        done = subprocess.run(["make", "-n", target, f"WORKSPACE={tmp_path}/w"],
                              cwd=folder, capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    lab = dry_run("lab")
    assert f"coursekit workspace init --course {folder} --workspace {tmp_path}/w" in lab
    command = shlex.split(next(line for line in lab.splitlines() if "jupyter lab" in line))
    assert f"--ServerApp.root_dir={tmp_path}/w" in command
    # the links JupyterLab prints (its default URL) and the browser it starts open 00_setup
    assert "--LabApp.default_url=/lab/tree/notebooks/00_setup.ipynb" in command
    # the file to run: the working copy's, inside root_dir (jupyter refuses any other and exits)
    assert command[-1] == f"{tmp_path}/w/notebooks/00_setup.ipynb"
    echoed = next(line for line in lab.splitlines() if line.startswith("echo ") and "Starting JupyterLab" in line)
    assert "http://127.0.0.1:8888/lab/tree/notebooks/00_setup.ipynb " in echoed
    update = dry_run("update").splitlines()
    pull = next(i for i, line in enumerate(update) if "pull --ff-only" in line)
    merge = next(i for i, line in enumerate(update) if "coursekit workspace update" in line)
    assert pull < merge
