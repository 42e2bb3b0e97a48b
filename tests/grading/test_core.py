"""The check decorator: one line for the student, and a raise only where nbgrader grades."""

import json

import pytest

from coursekit.grading.core import GRADING_LOG, NBGRADER_EXECUTION, CheckFailure, check


@check("the answer")
def check_answer(fn):
    if fn() != 42:
        raise CheckFailure(f"expected 42, got {fn()!r}")


def stub():
    raise NotImplementedError("return the answer")


@pytest.mark.parametrize("mode", ["autograde", "validate"])
@pytest.mark.parametrize("fn, status", [(lambda: 41, "FAIL"), (stub, "TODO")])
def test_under_nbgrader_a_check_that_does_not_pass_prints_its_line_then_raises(
        monkeypatch, capsys, tmp_path, mode, fn, status):
    monkeypatch.setenv(NBGRADER_EXECUTION, mode)
    monkeypatch.setenv(GRADING_LOG, str(tmp_path / "log.jsonl"))
    with pytest.raises(CheckFailure, match=f"^{status}  the answer: "):
        check_answer(fn)
    assert capsys.readouterr().out.startswith(f"{status}  the answer: ")
    record = json.loads((tmp_path / "log.jsonl").read_text())
    assert record["check"] == "check_answer" and record["status"] == status.lower()


@pytest.mark.parametrize("mode", [None, "", "something else"])
def test_elsewhere_a_check_never_raises(monkeypatch, capsys, mode):
    if mode is None:
        monkeypatch.delenv(NBGRADER_EXECUTION, raising=False)
    else:
        monkeypatch.setenv(NBGRADER_EXECUTION, mode)
    assert not check_answer(lambda: 41) and check_answer(stub).status == "todo"
    assert capsys.readouterr().out.splitlines()[0].startswith("FAIL  the answer: expected 42, got 41")


def test_under_nbgrader_a_passing_check_returns_its_result(monkeypatch, capsys):
    monkeypatch.setenv(NBGRADER_EXECUTION, "autograde")
    assert check_answer(lambda: 42)
    assert capsys.readouterr().out == "PASS  the answer: all cases passed\n"
