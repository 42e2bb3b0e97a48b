"""Issue 29: a long asynchronous run holds flat memory.

The bounds of :mod:`coursekit.parallel.param_server.results` are made small here, so that a
run of a few hundred steps goes far past them: the records stay within them, while what the
chapter prints (idle seconds, the staleness histogram) still counts every step. The step
time that grew with the run came from summing every span at every snapshot; it is measured
in ``bench/bench_load.py --only async``, never asserted here.
"""

import tracemalloc

import numpy as np
import pytest

from coursekit.data import load_digits
from coursekit.parallel.param_server import PSConfig, results, train
from coursekit.parallel.param_server.consistency import ssp_gate
from coursekit.cluster.runner import LocalRunner

DATA = load_digits()
W = 3


@pytest.fixture
def small_bounds(monkeypatch):
    """Records and curves bounded far below the runs' lengths (raising=False: the code
    before issue 29 had no bounds, and must fail the assertions, not the set-up)."""
    monkeypatch.setattr(results, "MAX_RECORDS", 60, raising=False)
    monkeypatch.setattr(results, "MAX_CURVE_POINTS", 8, raising=False)


def test_records_stay_bounded_while_the_totals_count_every_step(small_bounds):
    cfg = PSConfig(model="ssp", staleness=2, steps=300, eval_every=2)
    result = train(LocalRunner(1 + W), cfg, DATA, workers=W)
    for w in result.workers:
        assert len(w.spans) <= 60 and w.spans.dropped == 3 * cfg.steps - len(w.spans)
        assert w.spans[-1].kind == "send"  # the newest are kept
        assert 0 < w.idle_s and 0 < w.compute_s and 0 < w.send_s
        for kind, total in (("compute", w.compute_s), ("idle", w.idle_s), ("send", w.send_s)):
            assert total >= sum(s.duration for s in w.spans if s.kind == kind)
        assert 4 <= len(w.curve_t) <= 8 and np.all(np.diff(w.curve_t) > 0)
    server = result.servers[0]
    assert len(server.staleness) == len(server.from_worker) <= 60
    assert len(server.update_t) <= 60 and server.updates_dropped == cfg.steps - len(server.update_t)
    assert server.dropped == W * cfg.steps - len(server.staleness)
    values, counts = result.staleness_histogram()
    assert counts.sum() == W * cfg.steps == result.applied  # every gradient, dropped or not
    assert values.max() <= 2 and f"staleness max {values.max()}" in result.summary()


def test_a_short_run_keeps_every_record_and_the_same_histogram():
    cfg = PSConfig(model="ssp", staleness=2, steps=40, jitter=0.001)
    result = train(LocalRunner(1 + W), cfg, DATA, workers=W)
    assert all(len(w.spans) == 3 * cfg.steps and w.spans.dropped == 0 for w in result.workers)
    values, counts = np.unique(result.staleness, return_counts=True)
    got = result.staleness_histogram()
    assert got[0].tolist() == values.tolist() and got[1].tolist() == counts.tolist()
    for w in result.workers:  # the running totals are the spans' sums
        idle = np.sum([s.duration for s in w.spans if s.kind == "idle"])
        assert w.idle_s == pytest.approx(idle, rel=1e-12, abs=1e-15)


@pytest.mark.slow  # 1200 steps of 3 workers under tracemalloc: a few seconds
def test_memory_is_flat_between_step_600_and_step_1200(small_bounds):
    """tracemalloc's traced bytes when the shard first sees a pull for clock 600 and for
    clock 1200: without bounds they grow ~1.2 KB per step (600 steps: ~700 KB)."""
    marks = {600: None, 1200: None}

    def gate(clock, clocks, staleness):  # the shard calls it for every gated pull
        if clock in marks and marks[clock] is None:
            marks[clock] = tracemalloc.get_traced_memory()[0]
        return ssp_gate(clock, clocks, staleness)

    cfg = PSConfig(model="ssp", staleness=2, steps=1300, eval_every=5)
    tracemalloc.start()
    try:
        train(LocalRunner(1 + W), cfg, DATA, workers=W, gate=gate)
    finally:
        tracemalloc.stop()
    growth = marks[1200] - marks[600]
    assert growth < 64 * 1024, f"{growth} bytes more at step 1200 than at step 600"
