"""Live progress: worker-side Reporter/publish, notebook-side follow, on local ranks."""

import threading

import pytest

from coursekit.cluster import live
from coursekit.cluster.runner import LocalRunner, RankFailure


def counting(comm, steps, gate=None):
    reporter = live.Reporter(interval=0.0)
    for step in range(steps):
        if gate is not None and step == steps // 2:
            gate.wait(10)
        reporter.log(step=step + 1, total=steps, loss=float(comm.rank * 100 + step))
    reporter.close()
    return comm.rank


def test_follow_sees_updates_while_the_run_is_going_and_returns_its_result():
    gate = threading.Event()
    seen = []

    def on_update(data):
        seen.append([dict(d) for d in data])
        if all(d.get("step", 0) >= 10 for d in data):
            gate.set()  # the ranks wait here halfway: we saw them mid-run

    run = LocalRunner(2, comm_timeout=10).start(counting, 20, gate)
    assert live.follow(run, on_update, interval=0.01, progress=False, timeout=30) == [0, 1]
    assert any(all(10 <= d["step"] < 20 for d in snap) for snap in seen)
    final = seen[-1]
    assert [d["step"] for d in final] == [20, 20]
    assert final[1]["loss"] == [100.0 + s for s in range(20)]  # the whole series, no gaps


def test_reporter_throttles_but_always_sends_the_last_values():
    got = []
    live.attach_sink(got.append)
    try:
        reporter = live.Reporter(interval=3600)
        for step in range(5):
            reporter.log(step=step, loss=step * 1.0)
        assert len(got) == 1  # only the first log went out
        reporter.close()
    finally:
        live.attach_sink(None)
    assert got[-1]["step"] == 4 and got[-1]["loss"] == [0.0, 1.0, 2.0, 3.0, 4.0]
    assert got[-1]["seq"] == 2


def test_publish_outside_an_engine_or_local_run_is_a_no_op():
    live.publish(step=1)  # neither a sink nor an engine: dropped, no error


def test_follow_reraises_the_run_error_and_times_out():
    def broken(comm):
        raise RuntimeError("boom")

    with pytest.raises(RankFailure, match=r"rank 0: RuntimeError: boom"):
        live.follow(LocalRunner(1).start(broken), interval=0.01, progress=False)
    slow = threading.Event()
    run = LocalRunner(1, comm_timeout=15).start(lambda comm: slow.wait(10))
    with pytest.raises(TimeoutError, match="did not finish within 0.1 s"):
        live.follow(run, interval=0.01, progress=False, timeout=0.1)
    slow.set()
    run.get(10)
    with pytest.raises(ValueError, match="interval=0: must be > 0"):
        live.follow(run, interval=0)


def test_a_bounded_reporter_thins_its_series_evenly_over_the_whole_run():
    reporter = live.Reporter(interval=3600, series=("step_s", "loss"), maxlen=4)
    for step in range(21):
        reporter.log(step=step, step_s=step, loss=10.0 * step)
        assert len(reporter.record["step_s"]) <= 4
        reporter.log(status="running")  # no series: not a point
    # full at 4 points, then every 2nd, 4th, 8th call: always evenly spaced from step 0
    assert reporter.record["step_s"] == [0, 8, 16]
    assert reporter.record["loss"] == [0.0, 80.0, 160.0] and reporter.record["step"] == 20
    assert live.Reporter(series=("loss",)).maxlen is None  # unbounded unless asked
    for bad in (3, 0, True, 2.0):
        with pytest.raises(ValueError, match="maxlen must be an even int"):
            live.Reporter(maxlen=bad)
