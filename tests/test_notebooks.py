"""The notebook pipeline: sources -> executed notebooks -> generated exercises.

nbval re-runs every notebook and compares outputs (the README's test command
passes ``--nbval notebooks solutions``); these tests check the rest: stored
notebooks match their sources, exercises match their solutions, stubs fail
their checks politely.
"""

import os
import re
import subprocess
import sys

import jupytext
import nbformat
import pytest

from coursekit.course import notebooks as nb

SOURCES = nb.all_sources()
SOLUTIONS = sorted((nb.ROOT / "solutions").glob("*.ipynb"))


def exercise_params():
    """Each exercise, marked ``cluster`` when running it starts one (in its kernel)."""
    return [pytest.param(s, id=s.name, marks=[pytest.mark.cluster] if "cluster.start(" in
                         nb.exercise_path(s).read_text() else [])
            for s in SOLUTIONS]


def code_and_markdown(notebook):
    return [(c.cell_type, c.source, c.metadata.get("tags", [])) for c in notebook.cells]


def cells_and_ids(notebook):
    """What a stored notebook must share with its source: cells, tags and the stable ids."""
    return [(*cell, c.id) for cell, c in zip(code_and_markdown(notebook), notebook.cells)]


def nbgrader_metadata(notebook):
    """What the builder writes for nbgrader (solution notebooks): each cell's, and jupytext's."""
    return [c.metadata.get("nbgrader") for c in notebook.cells], notebook.metadata.get("jupytext")


def test_there_is_a_notebook_for_every_chapter_zero_source():
    names = [s.name for s in SOURCES]
    assert "00_setup.py" in names and "00_latency_bandwidth.py" in names


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_stored_notebook_matches_its_source_and_is_fully_executed(source):
    stored, built = nbformat.read(nb.notebook_for(source), as_version=4), nb.build(source)
    assert cells_and_ids(stored) == cells_and_ids(built) and nbgrader_metadata(stored) == nbgrader_metadata(built), (
        f"{nb.notebook_for(source).name} is stale: run coursekit notebooks execute {source}"
    )
    code = [c for c in stored.cells if c.cell_type == "code"]
    assert all(c.execution_count is not None for c in code)
    assert not [o for c in code for o in c.outputs if o.output_type == "error"]


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_stored_outputs_read_well_before_the_notebook_runs(source):
    """No widget shows ipywidgets' raw repr and no empty progress bar is stored: that text
    is what a student sees before running, and what GitHub shows."""
    stored = nbformat.read(nb.notebook_for(source), as_version=4)
    texts = [nb._plain_text(o) for c in stored.cells if c.cell_type == "code" for o in c.outputs]
    assert not [t for t in texts if nb.RAW_WIDGET_REPR.search(t)]
    assert not [t for t in texts if nb.PROGRESS_BAR.search(t)]


def test_drop_progress_bars_keeps_other_outputs():
    notebook = nb.parse_source("# %%\nx = 1\n")
    bar = nbformat.v4.new_output("display_data", {"text/plain": "steps: 0it [00:00, ?it/s]"})
    other = nbformat.v4.new_output("display_data", {"text/plain": "accuracy 91%"})
    notebook.cells[0].outputs = [bar, other]
    nb.drop_progress_bars(notebook)
    assert notebook.cells[0].outputs == [other]


def test_every_notebook_has_a_source():
    built = sorted(p for folder in nb.SOURCE_FOLDERS for p in (nb.ROOT / folder).glob("*.ipynb"))
    assert built == sorted(nb.notebook_for(s) for s in SOURCES)


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.name)
def test_committed_exercise_is_generated_from_its_solution(solution):
    committed = nbformat.read(nb.exercise_path(solution), as_version=4)
    generated = nb.exercise_from(nbformat.read(solution, as_version=4))
    assert committed == generated, f"run: coursekit notebooks exercises"
    text = "\n".join(c.source for c in committed.cells)
    assert "### BEGIN SOLUTION" not in text and "raise NotImplementedError" in text


@pytest.mark.slow  # a Jupyter kernel per exercise
@pytest.mark.parametrize("solution", exercise_params())
def test_exercise_stubs_fail_their_checks_with_a_friendly_message(solution):
    """Run the untouched exercise: checks say TODO, and only the stubs raise."""
    from nbclient import NotebookClient

    exercise = nbformat.read(nb.exercise_path(solution), as_version=4)
    NotebookClient(exercise, timeout=120, allow_errors=True,
                   resources={"metadata": {"path": str(solution.parent)}}).execute()
    checks = [c for c in exercise.cells if c.cell_type == "code" and "check_" in c.source
              and "import" not in c.source]
    assert checks, "an exercise must call at least one check"
    for cell in checks:
        text = "".join(o.get("text", "") for o in cell.outputs)
        assert "TODO" in text and "not implemented yet" in text, text
    errors = [o for c in exercise.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert all(raised_by_a_stub(e.ename, e.evalue) for e in errors), [e.ename for e in errors]


def raised_by_a_stub(ename: str, evalue: str) -> bool:
    """A stub's NotImplementedError, raised here or on a runner's ranks (a RankFailure whose
    ranks raised it, or only timed out waiting for the rank that did)."""
    if ename != "RankFailure":
        return ename == "NotImplementedError"
    raised = re.findall(r"^\s*rank \d+: (\w+):", evalue, flags=re.M)
    return "NotImplementedError" in raised and set(raised) <= {"NotImplementedError",
                                                               "CommTimeout", "CommError"}


@pytest.mark.parametrize("ename, evalue, stub", [
    ("NotImplementedError", "TODO", True),
    ("ValueError", "bad", False),
    ("RankFailure", "train_ps failed on rank 0:\n  rank 0: NotImplementedError: TODO\n"
                    "  rank 1: CommTimeout: rank 1: recv timed out", True),
    ("RankFailure", "f failed on rank 1:\n  rank 1: ValueError: oops", False),
    ("RankFailure", "f failed on rank 0, rank 1:\n  rank 0: NotImplementedError: TODO\n"
                    "  rank 1: KeyError: 'x'", False),
])
def test_only_a_stubs_error_counts_as_one(ename, evalue, stub):
    assert raised_by_a_stub(ename, evalue) is stub


def test_parse_source_cells():
    notebook = nb.parse_source(
        "\n# %% [markdown]\n# # Title\n#\n# text\n\n# %%\nx = 1\n\n\n# %%\n\n# %%\ny = 2\n"
    )
    assert code_and_markdown(notebook) == [("markdown", "# Title\n\ntext", []), ("code", "x = 1", []),
                                           ("code", "y = 2", [])]
    assert [c.id for c in notebook.cells] == ["cell-000", "cell-001", "cell-002"]


def test_nbval_tags_on_the_cell_marker_become_cell_tags_so_students_read_code_first():
    notebook = nb.parse_source('# %% tags=["nbval-ignore-output"]\nprint(1)\n'
                               '# %% tags=["nbval-skip", "nbval-raises-exception"]\n# a comment\nx = 2\n')
    assert code_and_markdown(notebook) == [
        ("code", "print(1)", ["nbval-ignore-output"]),
        ("code", "# a comment\nx = 2", ["nbval-skip", "nbval-raises-exception"]),
    ]


def test_parse_source_ignores_jupytexts_header():
    header = "# ---\n# jupyter:\n#   kernelspec:\n#     name: other\n# ---\n\n"
    assert nb.parse_source(header + "# %%\nx = 1\n") == nb.parse_source("# %%\nx = 1\n")


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_no_stored_cell_shows_an_nbval_marker(source):
    stored = nbformat.read(nb.notebook_for(source), as_version=4)
    assert not [c.source for c in stored.cells if "NBVAL_" in c.source]


@pytest.mark.parametrize("text, where", [
    ("# %%[markdown]\n# text\n", 1),                              # the space left out
    ("# %%\nx = 1\n#%%\ny = 2\n", 3),                              # jupytext starts a cell here
    ("# %%\nx = 1\n    # %%\ny = 2\n", 3),                          # ... and here
    ("# %%\nx = 1\n# In[3]:\ny = 2\n", 3),                          # ... and here
    ("# %%\nx = 1\n# <codecell>\ny = 2\n", 3),                      # ... and here
    ("# %% [md]\n# text\n", 1),
    ("# %% [raw]\ntext\n", 1),
    ("# %% A title\nx = 1\n", 1),
    ('# %% [markdown] tags=["nbval-skip"]\n# text\n', 1),
    ('# %% jupyter={"source_hidden": true}\nx = 1\n', 1),
    ('# %% tags=["nbval-skip"] editable=false\nx = 1\n', 1),
    ('# %%\nx = 1\n# %% tags=["nbval-ignore-output"\ny = 2\n', 3),  # malformed JSON
    ("# %% tags=['nbval-skip']\nx = 1\n", 1),                       # JSON has no single quotes
    ('# %% tags=["nbval-ignore-ouput"]\nx = 1\n', 1),               # a typo in the tag
    ('# %% tags="nbval-skip"\nx = 1\n', 1),
    ("# %% tags=[]\nx = 1\n", 1),
])
def test_parse_source_refuses_a_cell_marker_it_does_not_read(text, where):
    with pytest.raises(nb.NotebookError) as error:
        nb.parse_source(text, name="notebooks/src/99_x.py")
    assert str(error.value).startswith(f"notebooks/src/99_x.py:{where}: ")
    assert str(error.value).endswith(nb.MARKERS_ALLOWED)


def test_parse_source_refuses_nbvals_comment_naming_the_cell_tag():
    with pytest.raises(nb.NotebookError) as error:
        nb.parse_source("# %%\n# NBVAL_IGNORE_OUTPUT\nprint(1)\n")
    assert str(error.value) == ("source:2: nbval's comment '# NBVAL_IGNORE_OUTPUT' is not read: "
                                'tag the cell instead, \'# %% tags=["nbval-ignore-output"]\'')


@pytest.mark.parametrize("text, where", [
    ("x = 1\n# %%\ny = 2\n", 1),
    ("\n# a comment\n# %%\ny = 2\n", 2),
    ("# ---\n# jupyter: {}\n\n# %%\nx = 1\n", 1),  # a header with no closing '# ---'
    ("\n\n", 3),
])
def test_parse_source_rejects_anything_but_jupytexts_header_before_the_first_marker(text, where):
    with pytest.raises(nb.NotebookError, match=f"^source:{where}: a notebook source must start with "
                                               "a '# %%' cell marker"):
        nb.parse_source(text)


def test_execute_names_the_file_and_line_of_a_marker_it_refuses(tmp_path, capsys):
    source = tmp_path / "src" / "99_x.py"
    source.parent.mkdir()
    source.write_text("# %%\nx = 1\n# %% [markdown ]\n# text\n")
    assert nb.main(["execute", str(source)]) == 2
    assert capsys.readouterr().err.startswith(f"error: {source}:3: '# %% [markdown ]' is not a cell marker")
    assert not nb.notebook_for(source).exists()


# ---- jupytext reads and writes the sources as the builder does --------------------------------


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_jupytext_reads_a_source_as_the_builder_does(source):
    text = source.read_text()
    assert code_and_markdown(jupytext.reads(text, fmt="py:percent")) == code_and_markdown(nb.parse_source(text))


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_a_source_saved_by_jupytext_builds_the_same_notebook(source):
    """Opened as a notebook in JupyterLab with jupytext and saved back: the same build. jupytext
    writes a '# ---' header of the notebook's metadata first, which the builder ignores."""
    built = nb.parse_source(source.read_text())
    saved = jupytext.writes(built, fmt="py:percent")
    assert saved.startswith("# ---\n# jupyter:\n")
    assert nb.parse_source(saved) == built


@pytest.mark.parametrize("source", SOURCES, ids=lambda p: p.name)
def test_an_executed_notebook_saved_by_jupytext_keeps_its_cells(source):
    """The stored notebook, with its outputs and execution metadata, saved as a source by
    jupytext: the builder reads the same cells, tags and ids back."""
    stored = nbformat.read(nb.notebook_for(source), as_version=4)
    assert cells_and_ids(nb.parse_source(jupytext.writes(stored, fmt="py:percent"))) == cells_and_ids(stored)


def test_strip_solutions_keeps_indentation_and_hint():
    text = ("def f(x):\n    # Hint: return x squared\n    ### BEGIN SOLUTION\n    return x * x\n"
            "    ### END SOLUTION\n")
    stub = nb.strip_solutions(text)
    assert stub == (
        "def f(x):\n    # YOUR CODE HERE: return x squared\n"
        "    raise NotImplementedError('return x squared')\n"
    )
    namespace = {}
    exec(stub, namespace)
    with pytest.raises(NotImplementedError):
        namespace["f"](3)
    # a '# Hint:' comment not just above the block, or at another indentation, stays a comment
    for kept in ("# Hint: h\nx = 1\n", "if x:\n# Hint: h\n"):
        stub = nb.strip_solutions(kept + "    ### BEGIN SOLUTION\n    x = 2\n    ### END SOLUTION")
        assert stub == kept + "    # YOUR CODE HERE: write this part\n    raise NotImplementedError('write this part')"


@pytest.mark.parametrize("text, message", [
    ("### END SOLUTION", "END SOLUTION without BEGIN"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", "inside another"),
    ("### BEGIN SOLUTION\nx = 1", "has no END SOLUTION"),
    ("### BEGIN SOLUTION: add one\nx += 1\n### END SOLUTION",
     r"line 1: text after BEGIN SOLUTION \(': add one'\) is lost in nbgrader's release: write it as a '# Hint: \.\.\.' line"),
])
def test_strip_solutions_rejects_broken_markers(text, message):
    with pytest.raises(nb.NotebookError, match=message):
        nb.strip_solutions(text)


@pytest.mark.slow  # the command in its own process
def test_cli_rejects_a_missing_notebook_with_one_clear_line():
    result = subprocess.run([sys.executable, "-m", "coursekit", "notebooks", "execute", "notebooks/99_nope.ipynb"],
                            capture_output=True, text=True, timeout=60, cwd=nb.ROOT)
    assert result.returncode == 2
    assert result.stderr.strip().count("\n") == 0
    assert "no notebook source for 'notebooks/99_nope.ipynb'" in result.stderr
    assert "notebooks/src/00_setup.py" in result.stderr


# ---- stored outputs that hold on any machine ---------------------------------------------------

UNDERFLOW_BITS = ("import numpy as np; from coursekit.nn.mixed_precision_demos import underflow; "
                  "print(np.asarray(underflow(epochs=2).grad_error, float).tobytes().hex())")


def computed_bits(env_overrides: dict[str, str]) -> str:
    """Chapter 8's mixed-precision errors, to the bit, from a fresh process that starts
    from the host's numerics (without the variables a notebook item run earlier in this
    session with --numerics=off-host put into os.environ) plus ``env_overrides``."""
    env = {k: v for k, v in os.environ.items() if k not in nb.off_host_numerics()}
    env.update(env_overrides)
    result = subprocess.run([sys.executable, "-c", UNDERFLOW_BITS], capture_output=True,
                            text=True, timeout=300, env=env, check=True)
    return result.stdout.strip()


@pytest.mark.slow  # two processes train for two epochs
def test_off_host_numerics_compute_other_bits_than_the_host():
    """`make test` re-runs the notebooks under off_host_numerics(): that only proves the
    stored outputs portable if it really changes what the notebooks compute."""
    forced = nb.off_host_numerics()
    assert forced["NUMBA_CPU_NAME"] == "generic"
    if not forced["NPY_DISABLE_CPU_FEATURES"]:
        pytest.skip("this CPU has no SIMD feature above NumPy's baseline: nothing to force")
    assert computed_bits(forced) != computed_bits({})


@pytest.mark.slow  # two pytest runs, a kernel each
@pytest.mark.parametrize("option, passes", [("--numerics=off-host", True), ("--numerics=host", False)])
def test_numerics_option_reaches_the_notebooks_kernels(tmp_path, option, passes):
    """A notebook whose stored output is what a kernel under off-host numerics prints."""
    cell = nbformat.v4.new_code_cell(
        "import os; print(os.environ.get('NUMBA_CPU_NAME'), 'NPY_DISABLE_CPU_FEATURES' in os.environ)",
        execution_count=1, outputs=[nbformat.v4.new_output("stream", name="stdout", text="generic True\n")])
    path = tmp_path / "probe.ipynb"
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), path)
    env = {k: v for k, v in os.environ.items()
           if k not in ("NUMBA_CPU_NAME", "NPY_DISABLE_CPU_FEATURES")}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "--nbval",
         "--nbval-current-env", option, str(path), "-q"],
        cwd=nb.ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert (result.returncode == 0) == passes, result.stdout[-2000:]
