"""Chapter 4: a failed server shard stops the run (named, nothing hangs), and the slowest
shard sets a BSP iteration's pace (T = T_0 + max_k d_k)."""

import time

import numpy as np
import pytest

from coursekit.cluster.runner import ClusterRunner, LocalRunner
from coursekit.comm import setup_comm
from coursekit.data import load_digits
from coursekit.parallel.param_server import PSConfig, ServerFailure, train
from coursekit.parallel.param_server.pace import bsp_iteration_s, measured_iteration_s

DATA = load_digits()


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(server_delay=[0.1]), TypeError, r"server_delay must be a dict \{server shard index"),
    (dict(server_delay={0: -1}), ValueError, r"server_delay\[0\]=-1"),
    (dict(server_delay={"a": 1}), TypeError, r"server_delay key must be an integer"),
    (dict(server_crash={0: -2}), ValueError, r"server_crash\[0\]=-2"),
    (dict(model="bsp", server_crash={0: 3}), ValueError,
     r"server_crash applies to 'ssp' and 'asp'"),
    (dict(model="ssp", server_crash={0: 3}, timeout=1.0, worker_timeout=1.0), ValueError,
     r"needs timeout > worker_timeout"),
])
def test_bad_server_faults_are_refused_with_a_clear_message(kwargs, error, match):
    with pytest.raises(error, match=match):
        PSConfig(**kwargs)


def test_a_fault_on_a_shard_the_run_does_not_have_is_refused_before_any_rank_starts():
    with pytest.raises(ValueError, match=r"server_delay names shard 2; server shards are 0..1"):
        train(LocalRunner(4), PSConfig(server_delay={2: 0.01}), DATA, servers=2)


@pytest.mark.parametrize("model,extra", [("asp", {}),
                                         ("ssp", dict(staleness=1, worker_timeout=0.3))])
def test_a_crashed_shard_stops_the_run_and_is_named(model, extra):
    runner = LocalRunner(4)
    cfg = PSConfig(model=model, steps=60, server_crash={1: 20}, timeout=0.5, **extra)
    start = time.perf_counter()
    with pytest.raises(ServerFailure) as failure:
        train(runner, cfg, DATA, workers=2, servers=2)
    assert time.perf_counter() - start < 20  # the workers waited 0.5 s, nobody hung
    lo, hi = 1205, 2410  # 2410 parameters (64*32 + 32 + 32*10 + 10) in two shards
    assert cfg.n_params == 2 * 1205 and failure.value.shards == [1]
    message = str(failure.value)
    assert message.startswith(f"server shard 1 (rank 1, parameters [{lo}, {hi})) failed")
    assert f"waited 0.5 s for shard 1 (rank 1, parameters [{lo}, {hi}))" in message
    # the same ranks run the next job: nothing the workers sent the dead shard is left over
    ok = train(runner, PSConfig(model=model, steps=5), DATA, workers=2, servers=2)
    assert ok.applied == 10


def test_the_slowest_shard_sets_the_bsp_pace_not_the_sum():
    assert bsp_iteration_s(0.004, {0: 0.02, 1: 0.05}) == pytest.approx(0.004 + 0.05)
    assert bsp_iteration_s(0.004, {}) == 0.004
    runner = LocalRunner(4)
    base = measured_iteration_s(train(runner, PSConfig(model="bsp", steps=15), DATA,
                                      workers=2, servers=2))
    delays = {0: 0.03, 1: 0.06}
    slow = measured_iteration_s(train(runner, PSConfig(model="bsp", steps=15,
                                                       server_delay=delays), DATA,
                                      workers=2, servers=2))
    # a sleep is never shorter than asked; the sum model (0.09 s) is 30 ms away
    assert 0.06 <= slow < 0.06 + 0.015 + base, (base, slow)


def test_measured_iteration_needs_a_bsp_run():
    r = train(LocalRunner(3), PSConfig(model="asp", steps=3), DATA, workers=2)
    with pytest.raises(ValueError, match="needs a BSP run"):
        measured_iteration_s(r)


@pytest.mark.slow  # waits out a comm timeout on engines
def test_a_crashed_shard_on_engines_stops_the_run_and_the_engines_serve_the_next(start_cluster):
    c = start_cluster(n=4)
    setup_comm(c, timeout=20)
    engines = ClusterRunner(c, timeout=60)
    cfg = PSConfig(model="asp", steps=60, server_crash={0: 30}, timeout=1.0)
    with pytest.raises(ServerFailure, match=r"server shard 0 \(rank 0, parameters \[0, 1205\)\)"):
        train(engines, cfg, workers=2, servers=2)
    ok = train(engines, PSConfig(model="bsp", steps=5), workers=2, servers=2)
    assert ok.applied == 10 and np.isfinite(ok.params).all()
