"""The chapter 4 check passes the reference gate and fails wrong ones with a useful message."""

import numpy as np

from coursekit.grading.ch04 import check_ssp_gate
from coursekit.parallel.param_server.consistency import ssp_gate


def test_the_reference_gate_passes():
    result = check_ssp_gate(ssp_gate, quiet=True)
    assert result, result.message


def test_a_stub_is_todo():
    def stub(clock, clocks, staleness):
        raise NotImplementedError("write the gate")
    assert check_ssp_gate(stub, quiet=True).status == "todo"


def test_off_by_one_is_caught():
    result = check_ssp_gate(lambda c, clocks, s: c - min(clocks) < s, quiet=True)
    assert result.status == "fail" and "may proceed with a bound of 0" in result.message


def test_a_gate_ignoring_the_bound_fails_the_table():
    result = check_ssp_gate(lambda c, clocks, s: True, quiet=True)
    assert result.status == "fail" and "may not proceed" in result.message


def test_the_real_run_catches_what_the_table_misses(monkeypatch):
    """A gate right on every table case but too lenient in practice fails on staleness."""
    from coursekit.grading import ch04
    monkeypatch.setattr(ch04, "CASES", ())
    result = check_ssp_gate(lambda c, clocks, s: c - int(np.min(clocks)) <= s + 1, quiet=True)
    assert result.status == "fail" and "the bound was exceeded" in result.message


def test_a_gate_stopping_the_slowest_worker_is_reported_as_a_deadlock(monkeypatch):
    from coursekit.grading import ch04
    monkeypatch.setattr(ch04, "CASES", ())
    result = check_ssp_gate(lambda c, clocks, s: c - int(np.min(clocks)) < s, quiet=True)
    assert result.status == "fail" and "deadlocked" in result.message


def test_a_non_boolean_answer_is_refused():
    result = check_ssp_gate(lambda c, clocks, s: "yes", quiet=True)
    assert result.status == "fail" and "must return True or False" in result.message
