"""nbgrader's cell metadata, written by the builder into the solution notebooks.

That nbgrader itself accepts it and grades with it is tests/test_nbgrader.py's job.
"""

import pytest

from coursekit.course import nbgrader_cells
from coursekit.course import notebooks as nb

EXERCISE = '''# %% [markdown]
# # Exercise
# %%
from coursekit.grading.ch04 import check_ssp_gate
# %%
def gate(clock, clocks, staleness):
    # Hint: compare
    ### BEGIN SOLUTION
    return clock - min(clocks) <= staleness
    ### END SOLUTION
# %%
check_ssp_gate(gate)
# %%
gate(1, [0], 1)
'''


def roles(notebook):
    return [(c.id, c.metadata["nbgrader"]) for c in notebook.cells]


def test_each_cell_is_read_only_a_solution_or_the_test_cell_of_one_check():
    notebook = nbgrader_cells.mark(nb.parse_source(EXERCISE))
    read_only = {"grade": False, "locked": True, "schema_version": 3, "solution": False}
    assert roles(notebook) == [
        ("cell-000", {**read_only, "grade_id": "cell-000"}),
        ("cell-001", {**read_only, "grade_id": "cell-001"}),
        ("cell-002", {"grade": False, "grade_id": "cell-002", "locked": False, "schema_version": 3, "solution": True}),
        ("cell-003", {"grade": True, "grade_id": "check_ssp_gate", "locked": True, "points": 1,
                      "schema_version": 3, "solution": False}),
        ("cell-004", {**read_only, "grade_id": "cell-004"}),
    ]
    assert notebook.metadata["jupytext"] == {"cell_metadata_filter": "-nbgrader"}
    assert roles(nbgrader_cells.mark(nb.parse_source(EXERCISE))) == roles(notebook)  # stable


@pytest.mark.parametrize("source", sorted((nb.ROOT / "solutions" / "src").glob("*.py")), ids=lambda p: p.name)
def test_every_exercise_scores_a_point_per_check_as_the_gradebook_does(source):
    from coursekit.course.gradebook import expected_checks

    notebook = nb.build(source)
    tests = [c.metadata.nbgrader for c in notebook.cells if c.metadata.nbgrader["grade"]]
    assert sorted(t["grade_id"] for t in tests) == expected_checks(notebook)
    assert {t["points"] for t in tests} == {1}
    ids = [c.metadata.nbgrader["grade_id"] for c in notebook.cells]
    assert len(set(ids)) == len(ids)
    assert any(c.metadata.nbgrader["solution"] for c in notebook.cells)


@pytest.mark.parametrize("change, message", [
    (("check_ssp_gate(gate)", "check_ssp_gate(gate)\ncheck_x(gate)"),
     "cell cell-003: calls check_ssp_gate, check_x: call each check"),
    (("gate(1, [0], 1)", "check_ssp_gate(gate)"), "cell cell-004: calls check_ssp_gate, which cell cell-003 calls"),
    (("# # Exercise", "# ### BEGIN SOLUTION\n# answer\n# ### END SOLUTION"), "cell cell-000: a solution block belongs"),
    (("check_ssp_gate(gate)", "### BEGIN SOLUTION\ncheck_ssp_gate(gate)\n### END SOLUTION"),
     "cell cell-003: a solution"),
    (("    ### END SOLUTION", ""), "cell cell-002: a BEGIN SOLUTION block has no END SOLUTION"),
])
def test_a_notebook_nbgrader_would_score_otherwise_is_refused_naming_the_cell(change, message):
    source = EXERCISE.replace(*change).replace("from coursekit.grading.ch04 import check_ssp_gate",
                                               "from coursekit.grading.ch04 import check_ssp_gate, check_x")
    with pytest.raises(nb.NotebookError, match=f"^ex.py, {message}"):
        nbgrader_cells.mark(nb.parse_source(source), name="ex.py")
