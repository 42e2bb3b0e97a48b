"""Chapter 4: the parameter server's shards, bad input, lost workers, checkpoints (ThreadComm)."""

import numpy as np
import pytest

from coursekit.comm import run_local
from coursekit.data import load_digits, shard
from coursekit.nn import MLP
from coursekit.parallel.checkpoint import CheckpointFallbackWarning, ShardState
from coursekit.parallel.param_server.async_sgd import PSConfig, collect, train, train_ps
from coursekit.runner import LocalRunner, RankFailure
from coursekit.parallel.param_server.protocol import (DONE, HELLO, PULL, PUSH, recv_reply, send_request,
                                            shard_ranges)
from coursekit.parallel.param_server.worker import batch_rows

DATA = load_digits()
THREADS = LocalRunner(8)  # every run takes the ranks its config needs


# ---- shards and configuration ---------------------------------------------------------------
@pytest.mark.parametrize("n,s", [(10, 1), (10, 3), (7, 7), (2410, 4)])
def test_shards_are_contiguous_balanced_and_cover_the_buffer(n, s):
    ranges = shard_ranges(n, s)
    assert ranges[0][0] == 0 and ranges[-1][1] == n
    assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    lengths = [hi - lo for lo, hi in ranges]
    assert max(lengths) - min(lengths) <= 1 and min(lengths) >= 1


@pytest.mark.parametrize("kwargs,match", [
    (dict(staleness=-1), r"staleness=-1: must be >= 0"),
    (dict(n_workers=0), r"n_workers=0: must be >= 1"),
    (dict(sizes=(2, 1), n_servers=4), r"4 server shards for 3 parameters"),
    (dict(n_servers=0), r"n_servers must be a positive int"),
    (dict(model="hogwild"), r"model='hogwild': allowed \('bsp', 'ssp', 'asp'\)"),
    (dict(model="bsp", staleness=2), r"staleness=2 applies to model='ssp' only"),
    (dict(model="ssp", n_push=4), r"n_fetch and n_push apply to model='asp' only"),
    (dict(warmup=200, steps=100), r"warmup=200 exceeds steps=100"),
    (dict(straggler={0: 6.0}), r"straggler\[0\]=6.0 s per step would get worker 0 declared lost"),
    (dict(straggler={5: 0.1}), r"straggler names worker 5; workers are 0..2"),
    (dict(crash={1: 100}), r"crash\[1\]=100: must be a step in 0..99"),
    (dict(checkpoint_every=5), r"need a checkpoint_dir"),
    (dict(lr=0.0), r"lr=0.0: must be > 0"),
])
def test_bad_configurations_are_refused_with_a_clear_message(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PSConfig(**kwargs)


def test_a_run_needs_enough_ranks():
    with pytest.raises(ValueError, match=r"1 server\(s\) \+ 3 worker\(s\) = 4 ranks, but the comm has 2"):
        run_local(train_ps, 2, PSConfig(n_workers=3), DATA)


# ---- bad pushes --------------------------------------------------------------------------------
def _rogue(comm, cfg, pushes):
    """Worker rank ``comm.rank`` speaking the protocol by hand, pushing ``pushes``."""
    comm.barrier()
    send_request(comm, 0, PULL, comm.rank, HELLO)
    recv_reply(comm, 0, np.empty(cfg.n_params, cfg.dtype))
    for clock, grad in enumerate(pushes, 1):
        send_request(comm, 0, PUSH, comm.rank, clock, 0, 1, grad)
    send_request(comm, 0, DONE, comm.rank, len(pushes))


def _with_rogue(cfg, pushes, data=DATA):
    rogue = cfg.n_ranks - 1
    outputs = run_local(lambda comm: _rogue(comm, cfg, pushes) if comm.rank == rogue
                        else train_ps(comm, cfg, data), cfg.n_ranks, timeout=20)
    return collect(cfg, outputs)


@pytest.mark.parametrize("model", ["asp", "ssp"])
def test_gradients_of_the_wrong_size_or_dtype_are_rejected_and_the_others_served(model):
    cfg = PSConfig(model=model, n_workers=3, steps=12)
    n = cfg.n_params
    bad = [np.zeros(n, np.float64), np.zeros(n - 1, np.float32), np.zeros((n, 1), np.float32)]
    result = _with_rogue(cfg, bad * 4)  # 12 pushes, all bad: the rogue keeps its clock going
    assert len(result.errors) == 12
    assert f"expected float32({n},) (parameters [0, {n})), got float64({n},)" in result.errors[0]
    assert f"got float32({n - 1},)" in result.errors[1] and f"got float32({n}, 1)" in result.errors[2]
    assert "worker 2" in result.errors[0]
    server = result.servers[0]
    assert server.applied == 2 * cfg.steps  # the two honest workers, every gradient once
    assert set(server.from_worker.tolist()) == {0, 1}
    assert [w.status for w in result.workers[:2]] == ["finished", "finished"]


def test_rejected_gradients_leave_the_average_of_the_honest_ones():
    """SSP s=0, a rogue pushing junk: every update is the mean of the two honest gradients."""
    cfg = PSConfig(model="ssp", n_workers=3, steps=6, dtype="float64", batch_size=8)
    data = load_digits(dtype=np.float64)
    result = _with_rogue(cfg, [np.zeros(3)] * cfg.steps, data)
    mlp = MLP(cfg.sizes, dtype=cfg.dtype, seed=cfg.seed)
    shards = [shard(data.X_train, data.y_train, w, 3) for w in range(2)]
    for t in range(cfg.steps):
        rows = [batch_rows(cfg.seed, w, t, len(X), cfg.batch_size) for w, (X, _) in enumerate(shards)]
        _, g = mlp.loss_and_grad(np.concatenate([X[r] for (X, _), r in zip(shards, rows)]),
                                 np.concatenate([y[r] for (_, y), r in zip(shards, rows)]))
        mlp.params[...] -= cfg.lr * g
    np.testing.assert_allclose(result.params, mlp.params, rtol=1e-10, atol=1e-12)


# ---- lost workers --------------------------------------------------------------------------------
@pytest.mark.parametrize("model,extra", [("asp", {}), ("ssp", {"staleness": 1})])
def test_a_crashed_worker_is_reported_lost_and_the_others_finish(model, extra):
    cfg = PSConfig(model=model, n_workers=3, steps=30, crash={1: 12}, worker_timeout=0.3,
                   n_servers=2, **extra)
    result = train(THREADS, cfg, DATA)
    assert [w.status for w in result.workers] == ["finished", "crashed", "finished"]
    assert result.workers[1].steps == 12
    (lost,) = result.lost
    assert lost["worker"] == 1 and lost["clock"] == 12 and lost["t"] > 0.3
    assert "worker 1 (rank 3) sent nothing for 0.3 s at clock 12: declared lost" in result.errors[0]
    for server in result.servers:
        assert server.applied == 2 * cfg.steps + 12  # everything pushed was applied, once
        assert np.bincount(server.from_worker).tolist() == [30, 12, 30]
        if model == "ssp":
            assert server.staleness.max() <= 1


def test_bsp_stops_when_a_worker_dies():
    cfg = PSConfig(model="bsp", n_workers=3, steps=20, crash={2: 5}, worker_timeout=0.3, timeout=5)
    with pytest.raises(RuntimeError, match=r"BSP: worker 2 \(rank 3\) sent no gradient for "
                                           r"iteration 5 within 0.3 s"):
        train(THREADS, cfg, DATA)


def test_a_gate_that_never_opens_is_reported_as_a_deadlock():
    cfg = PSConfig(model="ssp", n_workers=2, steps=5, timeout=5)
    with pytest.raises(RuntimeError, match="deadlock: every live worker waits at the clock gate"):
        train(THREADS, cfg, DATA, gate=lambda clock, clocks, s: False)


# ---- checkpoint / restore ----------------------------------------------------------------------
def test_a_restarted_run_continues_from_the_checkpoint_without_losing_updates(tmp_path):
    common = dict(model="ssp", n_servers=2, n_workers=3, momentum=0.9, dtype="float64", jitter=0.001)
    straight = train(THREADS, PSConfig(steps=20, **common), DATA)
    first = train(THREADS, PSConfig(steps=14, checkpoint_every=5, checkpoint_dir=str(tmp_path),
                                    **common), DATA)
    assert len(first.servers[0].checkpoints) == 2  # versions 5 and 10
    # the run "dies" after version 14; the restart goes on from version 10
    again = train(THREADS, PSConfig(steps=20, resume=True, checkpoint_dir=str(tmp_path),
                                    **common), DATA)
    assert [w.steps for w in again.workers] == [10, 10, 10]
    assert again.applied == 3 * 20 and again.servers[0].version == 20
    assert np.array_equal(again.params, straight.params)  # momentum included


def test_asp_restart_keeps_every_update_taken_before_the_checkpoint(tmp_path):
    common = dict(model="asp", n_workers=2, checkpoint_dir=str(tmp_path))
    first = train(THREADS, PSConfig(steps=10, checkpoint_every=4, **common), DATA)
    saved = ShardState.latest(tmp_path, 1)
    assert saved == 20 and first.servers[0].version == 20
    assert sorted(p.name for p in tmp_path.glob("*.npz")) == [  # the newest 3 are kept
        "shard0of1_v12.npz", "shard0of1_v16.npz", "shard0of1_v20.npz"]
    again = train(THREADS, PSConfig(steps=15, resume=True, **common), DATA)
    assert again.servers[0].version == 20 + 2 * 5 and again.applied == 2 * 15
    assert [w.steps for w in again.workers] == [5, 5]


@pytest.mark.filterwarnings("ignore::coursekit.parallel.checkpoint.CheckpointFallbackWarning")
def test_only_a_version_every_shard_saved_is_restored(tmp_path):
    cfg = PSConfig(model="ssp", n_servers=2, n_workers=2, steps=10, checkpoint_every=5,
                   checkpoint_dir=str(tmp_path))
    train(THREADS, cfg, DATA)
    assert ShardState.latest(tmp_path, 2) == 10
    (tmp_path / "shard1of2_v10.npz").unlink()  # shard 1 died before saving version 10
    with pytest.warns(CheckpointFallbackWarning,
                      match=r"shard1of2_v10\.npz: missing .* Using version 5"):
        assert ShardState.latest(tmp_path, 2) == 5
    with pytest.raises(ValueError, match="no checkpoint in .* has intact files from all 3 shards"):
        ShardState.latest(tmp_path, 3)
    # checked by the shards, where the checkpoints are: the run's one error type names them
    with pytest.raises(RankFailure, match="ValueError: .* has clocks for 2 workers; this run has 3"):
        train(THREADS, PSConfig(model="ssp", n_servers=2, n_workers=3, steps=10, resume=True,
                                checkpoint_dir=str(tmp_path)), DATA)
    with pytest.raises(RankFailure, match=r"holds parameters \[\d+, \d+\) but this run's shard \d "
                                           r"holds \[\d+, \d+\): the model or n_servers changed"):
        train(THREADS, PSConfig(model="ssp", n_servers=2, n_workers=2, steps=10, resume=True,
                                sizes=(64, 16, 10), checkpoint_dir=str(tmp_path)), DATA)
