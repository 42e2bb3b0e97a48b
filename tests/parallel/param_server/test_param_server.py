"""Chapter 4: the parameter server's shards and topology, bad input, lost workers, checkpoints
(ThreadComm)."""

from types import SimpleNamespace

import numpy as np
import pytest

from coursekit.comm import PeerGone, run_local
from coursekit.data import load_digits, shard
from coursekit.nn import MLP
from coursekit.parallel.checkpoint import CheckpointFallbackWarning, ShardState
from coursekit.parallel.param_server.async_sgd import PSConfig, collect, train, train_ps
from coursekit.cluster.runner import LocalRunner, RankFailure
from coursekit.parallel.param_server.protocol import (DONE, HELLO, PULL, PUSH, PSTopology,
                                                      recv_reply, send_request, shard_ranges)
from coursekit.parallel.param_server import bsp
from coursekit.parallel.param_server.worker import ShardSilent, Worker, batch_rows

DATA = load_digits()
THREADS = LocalRunner(8)  # every run takes the ranks its workers= and servers= need


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
    (dict(model="hogwild"), r"model='hogwild': allowed \('bsp', 'ssp', 'asp'\)"),
    (dict(model="bsp", staleness=2), r"staleness=2 applies to model='ssp' only"),
    (dict(model="ssp", n_push=4), r"n_fetch and n_push apply to model='asp' only"),
    (dict(warmup=200, steps=100), r"warmup=200 exceeds steps=100"),
    (dict(straggler={0: 6.0}), r"straggler\[0\]=6.0 s per step would get worker 0 declared lost"),
    (dict(straggler={-1: 0.1}), r"straggler key=-1: must be >= 0 \(a worker index\)"),
    (dict(crash={1: 100}), r"crash\[1\]=100: must be a step in 0..99"),
    (dict(checkpoint_every=5), r"need a checkpoint_dir"),
    (dict(lr=0.0), r"lr=0.0: must be > 0"),
])
def test_bad_configurations_are_refused_with_a_clear_message(kwargs, match):
    with pytest.raises(ValueError, match=match):
        PSConfig(**kwargs)


# ---- topology: servers + workers ranks, checked before any rank starts ------------------------
class NoRanks(LocalRunner):
    """A runner that fails the test if a run gets as far as starting its ranks."""

    def start(self, fn, *args, **kwargs):
        raise AssertionError("a rank started: the arguments were not checked first")


class CountingRunner(LocalRunner):
    """A LocalRunner that records how many ranks each run started on."""

    def __init__(self, size):
        super().__init__(size)
        self.started = []

    def start(self, fn, *args, ranks=None, **kwargs):
        self.started.append(ranks)
        return super().start(fn, *args, ranks=ranks, **kwargs)


@pytest.mark.parametrize("servers,workers", [(1, 1), (2, 3), (3, 2)])
def test_a_run_takes_servers_plus_workers_ranks(servers, workers):
    runner = CountingRunner(8)
    result = train(runner, PSConfig(model="ssp", steps=4), DATA, workers=workers, servers=servers)
    assert runner.started == [servers + workers]
    assert result.topology == PSTopology(servers, workers)
    assert len(result.servers) == servers and len(result.workers) == workers
    assert [w.status for w in result.workers] == ["finished"] * workers
    assert [{s.rank for s in w.spans} for w in result.workers] == [
        {servers + w} for w in range(workers)]
    assert result.applied == workers * 4


def test_workers_none_takes_every_rank_that_is_not_a_server():
    runner = CountingRunner(5)
    result = train(runner, PSConfig(model="asp", steps=3), DATA, servers=2)
    assert runner.started == [5] and result.topology == PSTopology(servers=2, workers=3)


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(workers=4), ValueError,
     r"workers=4 and servers=1 need 5 ranks but LocalRunner\(4\) has 4: use at most 3 workers"),
    (dict(workers=3, servers=2), ValueError, r"workers=3 and servers=2 need 5 ranks"),
    (dict(workers=1, servers=5), ValueError, r"need 6 ranks but LocalRunner\(4\) has 4: use at "
                                             r"most 3 server"),
    (dict(servers=4), ValueError, r"servers=4 leave no rank of LocalRunner\(4\) \(4 ranks\) for "
                                  r"a worker \(a parameter server needs at least one worker\)"),
    (dict(workers=0), ValueError, r"workers=0: must be >= 1"),
    (dict(servers=0), ValueError, r"servers=0: must be >= 1"),
    (dict(workers=2.0), TypeError, r"workers must be an integer >= 1"),
    (dict(servers="2"), TypeError, r"servers must be an integer >= 1"),
])
def test_a_shape_that_does_not_fit_the_runner_is_refused_before_any_rank_starts(kwargs, error,
                                                                                 match):
    with pytest.raises(error, match=match):
        train(NoRanks(4), PSConfig(), DATA, **kwargs)


@pytest.mark.parametrize("config,kwargs,match", [
    (PSConfig(crash={3: 5}), dict(workers=3), r"crash names worker 3; workers are 0..2"),
    (PSConfig(straggler={2: 0.1}), dict(workers=2, servers=2),
     r"straggler names worker 2; workers are 0..1"),
    (PSConfig(sizes=(2, 1)), dict(workers=1, servers=4), r"4 server shards for 3 parameters"),
])
def test_a_config_that_does_not_fit_the_topology_is_refused_before_any_rank_starts(config, kwargs,
                                                                                   match):
    with pytest.raises(ValueError, match=match):
        train(NoRanks(8), config, DATA, **kwargs)


def test_every_rank_checks_the_topology_its_comm_gives():
    with pytest.raises(ValueError, match=r"crash names worker 3; workers are 0..2"):
        run_local(train_ps, 4, PSConfig(crash={3: 5}), DATA)
    with pytest.raises(ValueError, match=r"servers=2 leave no rank of the comm \(2 ranks\)"):
        run_local(train_ps, 2, PSConfig(), DATA, servers=2)


# ---- bad pushes --------------------------------------------------------------------------------
def _rogue(comm, cfg, pushes):
    """Worker rank ``comm.rank`` speaking the protocol by hand, pushing ``pushes``."""
    comm.barrier()
    send_request(comm, 0, PULL, comm.rank, HELLO)
    recv_reply(comm, 0, np.empty(cfg.n_params, cfg.dtype))
    for clock, grad in enumerate(pushes, 1):
        send_request(comm, 0, PUSH, comm.rank, clock, 0, 1, grad)
    send_request(comm, 0, DONE, comm.rank, len(pushes))


def _with_rogue(cfg, pushes, data=DATA, topology=PSTopology(servers=1, workers=3)):
    rogue = topology.n_ranks - 1
    outputs = run_local(lambda comm: _rogue(comm, cfg, pushes) if comm.rank == rogue
                        else train_ps(comm, cfg, data), topology.n_ranks, timeout=20)
    return collect(cfg, topology, outputs)


@pytest.mark.parametrize("model", ["asp", "ssp"])
def test_gradients_of_the_wrong_size_or_dtype_are_rejected_and_the_others_served(model):
    cfg = PSConfig(model=model, steps=12)
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
    cfg = PSConfig(model="ssp", steps=6, dtype="float64", batch_size=8)
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
    cfg = PSConfig(model=model, steps=30, crash={1: 12}, worker_timeout=0.3, **extra)
    result = train(THREADS, cfg, DATA, workers=3, servers=2)
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
    cfg = PSConfig(model="bsp", steps=20, crash={2: 5}, worker_timeout=0.3, timeout=5)
    with pytest.raises(RuntimeError, match=r"BSP: worker 2 \(rank 3\) sent no gradient for "
                                           r"iteration 5 within 0.3 s"):
        train(THREADS, cfg, DATA, workers=3)


def _gone(*args, **kwargs):
    raise PeerGone("rank 1: recv(source=3, tag=2) stopped waiting for rank 3 (tag 2): its "
                   "process has exited, and no message it sent before is left to match")


def test_a_peer_whose_process_ended_is_reported_as_gone_not_as_late():
    """A PeerGone (a CommTimeout raised as soon as the peer's process is known to have
    ended) must not be reported as a peer that was silent for the whole timeout."""
    server = SimpleNamespace(topology=SimpleNamespace(worker_ranks=[1, 2, 3]), version=5,
                             comm=SimpleNamespace(recv=_gone), cfg=PSConfig(worker_timeout=0.3))
    with pytest.raises(RuntimeError, match=r"BSP: worker 2 \(rank 3\) sent no gradient for "
                                           r"iteration 5 before its process exited, so no"):
        bsp._gradient(server, 2)
    worker = SimpleNamespace(comm=SimpleNamespace(recv=_gone), ranges=[(0, 4)], worker=0, rank=2,
                             steps=7, cfg=PSConfig(timeout=5), weights=np.zeros(4),
                             elapsed=lambda: 0.0)
    with pytest.raises(ShardSilent, match=r"^worker 0 \(rank 2\) waited for shard 0 \(rank 0, "
                                          r"parameters \[0, 4\)\) after 7 steps: its process "
                                          r"has exited$"):
        Worker.receive_weights(worker)


def test_a_gate_that_never_opens_is_reported_as_a_deadlock():
    cfg = PSConfig(model="ssp", steps=5, timeout=5)
    with pytest.raises(RuntimeError, match="deadlock: every live worker waits at the clock gate"):
        train(THREADS, cfg, DATA, workers=2, gate=lambda clock, clocks, s: False)


# ---- checkpoint / restore ----------------------------------------------------------------------
def test_a_restarted_run_continues_from_the_checkpoint_without_losing_updates(tmp_path):
    common = dict(model="ssp", momentum=0.9, dtype="float64", jitter=0.001)
    shape = dict(workers=3, servers=2)
    straight = train(THREADS, PSConfig(steps=20, **common), DATA, **shape)
    first = train(THREADS, PSConfig(steps=14, checkpoint_every=5, checkpoint_dir=str(tmp_path),
                                    **common), DATA, **shape)
    assert len(first.servers[0].checkpoints) == 2  # versions 5 and 10
    # the run "dies" after version 14; the restart goes on from version 10
    again = train(THREADS, PSConfig(steps=20, resume=True, checkpoint_dir=str(tmp_path),
                                    **common), DATA, **shape)
    assert [w.steps for w in again.workers] == [10, 10, 10]
    assert again.applied == 3 * 20 and again.servers[0].version == 20
    assert np.array_equal(again.params, straight.params)  # momentum included


def test_asp_restart_keeps_every_update_taken_before_the_checkpoint(tmp_path):
    common = dict(model="asp", checkpoint_dir=str(tmp_path))
    first = train(THREADS, PSConfig(steps=10, checkpoint_every=4, **common), DATA, workers=2)
    saved = ShardState.latest(tmp_path, 1)
    assert saved == 20 and first.servers[0].version == 20
    assert sorted(p.name for p in tmp_path.glob("*.npz")) == [  # the newest 3 are kept
        "shard0of1_v12.npz", "shard0of1_v16.npz", "shard0of1_v20.npz"]
    again = train(THREADS, PSConfig(steps=15, resume=True, **common), DATA, workers=2)
    assert again.servers[0].version == 20 + 2 * 5 and again.applied == 2 * 15
    assert [w.steps for w in again.workers] == [5, 5]


@pytest.mark.filterwarnings("ignore::coursekit.parallel.checkpoint.CheckpointFallbackWarning")
def test_only_a_version_every_shard_saved_is_restored(tmp_path):
    cfg = PSConfig(model="ssp", steps=10, checkpoint_every=5, checkpoint_dir=str(tmp_path))
    train(THREADS, cfg, DATA, workers=2, servers=2)
    assert ShardState.latest(tmp_path, 2) == 10
    (tmp_path / "shard1of2_v10.npz").unlink()  # shard 1 died before saving version 10
    with pytest.warns(CheckpointFallbackWarning,
                      match=r"shard1of2_v10\.npz: missing .* Using version 5"):
        assert ShardState.latest(tmp_path, 2) == 5
    with pytest.raises(ValueError, match="no checkpoint in .* has intact files from all 3 shards"):
        ShardState.latest(tmp_path, 3)
    with pytest.raises(RankFailure, match="no checkpoint in .* has intact files from all 3 shards"):
        train(THREADS, PSConfig(model="ssp", steps=10, resume=True, checkpoint_dir=str(tmp_path)),
              DATA, workers=2, servers=3)
    # checked by the shards, where the checkpoints are: the run's one error type names them,
    # and every file of another run, with what differs
    with pytest.raises(RankFailure, match=r"ValueError: no checkpoint .* unusable: "
                                          r"shard0of2_v10\.npz: written by a different run: "
                                          r"workers 2 there, 3 here; .*shard1of2_v5\.npz: "
                                          r"written by a different run: workers 2 there, 3 here"):
        train(THREADS, PSConfig(model="ssp", steps=10, resume=True, checkpoint_dir=str(tmp_path)),
              DATA, workers=3, servers=2)
    with pytest.raises(RankFailure, match=r"shard0of2_v5\.npz: written by a different run: sizes "
                                           r"\[64, 32, 10\] there, \[64, 16, 10\] here"):
        train(THREADS, PSConfig(model="ssp", steps=10, resume=True, sizes=(64, 16, 10),
                                checkpoint_dir=str(tmp_path)), DATA, workers=2, servers=2)


# ---- read-my-writes ------------------------------------------------------------------------------
def test_an_ssp_worker_reads_its_own_pending_update():
    """Ho et al.'s read-my-writes: worker 0 pushes g for iteration 0 while worker 1 has not
    pushed yet; its next pull (allowed: s = 1) holds w0 - lr/2 g, not the shard's w0."""
    import threading

    cfg = PSConfig(model="ssp", staleness=1, steps=1, dtype="float64", lr=0.5)
    n = cfg.n_params
    g = np.linspace(-1.0, 1.0, n)
    pushed, seen = threading.Event(), {}

    def worker(comm):
        comm.barrier()
        w0 = np.empty(n)
        send_request(comm, 0, PULL, comm.rank, HELLO)
        recv_reply(comm, 0, w0)
        if comm.rank == 1:  # worker 0: push, then read at clock 1 before worker 1 pushes
            send_request(comm, 0, PUSH, comm.rank, 1, 0, 1, g)
            send_request(comm, 0, PULL, comm.rank, 1)
            mine = np.empty(n)
            seen["version"] = recv_reply(comm, 0, mine)[0]
            seen["w0"], seen["mine"] = w0, mine
            pushed.set()
        else:  # worker 1 pushes only after worker 0 has read
            assert pushed.wait(10)
            send_request(comm, 0, PUSH, comm.rank, 1, 0, 1, -g)
        send_request(comm, 0, DONE, comm.rank, 1)

    outputs = run_local(lambda comm: train_ps(comm, cfg) if comm.rank == 0 else worker(comm),
                        3, timeout=20)
    assert seen["version"] == 0  # the shard has applied nothing yet ...
    np.testing.assert_array_equal(seen["mine"], seen["w0"] - 0.25 * g)  # ... but it sees its own
    np.testing.assert_array_equal(outputs[0].params, seen["w0"])  # mean(g, -g) = 0 applied
