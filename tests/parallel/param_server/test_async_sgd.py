"""Chapter 4: SSP / ASP / BSP training on the parameter server against independent references.

* BSP == serial SGD on the concatenation of the workers' batches (float64, allclose);
* SSP with s = 0 == BSP bit for bit, with random delays that reorder every message;
* ASP whose warm-up covers the whole run == BSP;
* invariants of asynchronous runs: staleness within the bound, every gradient applied once.
"""

import numpy as np
import pytest

from coursekit.data import load_digits, shard
from coursekit.nn import MLP
from coursekit.nn.optim import make_optimizer
from coursekit.parallel.param_server import PSConfig, train
from coursekit.cluster.runner import LocalRunner
from coursekit.parallel.param_server.worker import batch_rows

DATA = load_digits(dtype=np.float64)
THREADS = LocalRunner(8)  # every run takes the ranks its workers= and servers= need


def serial_large_batch(cfg: PSConfig, workers: int) -> np.ndarray:
    """Plain SGD on one process: step t uses all workers' step-t rows at once."""
    mlp = MLP(cfg.sizes, dtype=cfg.dtype, seed=cfg.seed)
    opt = make_optimizer(mlp.params, cfg.lr, cfg.momentum)
    shards = [shard(DATA.X_train, DATA.y_train, w, workers) for w in range(workers)]
    for t in range(cfg.steps):
        rows = [batch_rows(cfg.seed, w, t, len(X), cfg.batch_size) for w, (X, _) in enumerate(shards)]
        X = np.concatenate([Xw[r] for (Xw, _), r in zip(shards, rows)])
        y = np.concatenate([yw[r] for (_, yw), r in zip(shards, rows)])
        _, g = mlp.loss_and_grad(X, y)
        opt.step(g)
    return mlp.params


@pytest.mark.parametrize("servers,workers,momentum", [(1, 1, 0.0), (1, 3, 0.0), (3, 2, 0.9)])
def test_bsp_equals_serial_large_batch(servers, workers, momentum):
    cfg = PSConfig(model="bsp", steps=25, momentum=momentum, dtype="float64", batch_size=8)
    result = train(THREADS, cfg, DATA, workers=workers, servers=servers)
    np.testing.assert_allclose(result.params, serial_large_batch(cfg, workers),
                               rtol=1e-10, atol=1e-12)
    assert result.applied == workers * cfg.steps
    assert not result.staleness.any()


@pytest.mark.parametrize("servers,momentum", [(1, 0.0), (2, 0.9), (3, 0.0)])
def test_ssp_with_zero_staleness_equals_bsp_bit_for_bit(servers, momentum):
    common = dict(steps=25, momentum=momentum, dtype="float64")
    shape = dict(workers=3, servers=servers)
    bsp = train(THREADS, PSConfig(model="bsp", **common), DATA, **shape)
    # jitter reorders the pushes and pulls every run: the gate must still pin every read
    ssp = train(THREADS, PSConfig(model="ssp", staleness=0, jitter=0.002, straggler={2: 0.003},
                                  **common), DATA, **shape)
    assert np.array_equal(ssp.params, bsp.params)
    assert not ssp.staleness.any()


def test_asp_whose_warmup_covers_the_run_equals_bsp():
    common = dict(steps=15, dtype="float64")
    bsp = train(THREADS, PSConfig(model="bsp", **common), DATA, workers=3, servers=2)
    asp = train(THREADS, PSConfig(model="asp", warmup=15, jitter=0.001, **common), DATA,
                workers=3, servers=2)
    assert np.array_equal(asp.params, bsp.params)


def test_bsp_differs_from_a_stale_run():
    """The equalities above can fail: real staleness changes the weights."""
    common = dict(steps=20, dtype="float64")
    bsp = train(THREADS, PSConfig(model="bsp", **common), DATA, workers=3)
    ssp = train(THREADS, PSConfig(model="ssp", staleness=3, straggler={0: 0.01}, **common), DATA,
                workers=3)
    assert ssp.staleness.max() > 0
    assert not np.array_equal(ssp.params, bsp.params)


@pytest.mark.parametrize("staleness", [1, 2, 4])
def test_ssp_staleness_never_exceeds_the_bound_and_every_gradient_counts_once(staleness):
    cfg = PSConfig(model="ssp", staleness=staleness, steps=30, jitter=0.001, straggler={3: 0.004})
    result = train(THREADS, cfg, DATA, workers=4, servers=2)
    for server in result.servers:
        assert 0 <= server.staleness.min() and server.staleness.max() <= staleness
        assert np.bincount(server.from_worker).tolist() == [cfg.steps] * 4
        assert server.version == cfg.steps and server.applied == 4 * cfg.steps
    assert [w.status for w in result.workers] == ["finished"] * 4


def test_asp_applies_every_accrued_gradient_once():
    cfg = PSConfig(model="asp", steps=23, n_fetch=3, n_push=5, warmup=4, jitter=0.001)
    W = 3
    result = train(THREADS, cfg, DATA, workers=W, servers=2)
    pushes_per_worker = cfg.warmup + -(-(cfg.steps - cfg.warmup) // cfg.n_push)  # ceil
    for server in result.servers:
        assert server.applied == W * cfg.steps
        assert server.version == cfg.warmup + W * (pushes_per_worker - cfg.warmup)
        assert (server.staleness >= 0).all()
        assert np.bincount(server.from_worker).tolist() == [pushes_per_worker] * W
        # the warm-up is synchronous: its updates have staleness 0
        assert not server.staleness[:cfg.warmup * W].any()


def test_workers_report_time_throughput_and_accuracy():
    cfg = PSConfig(model="ssp", staleness=1, steps=40, eval_every=10, lr=0.2)
    result = train(THREADS, cfg, load_digits(), workers=2)
    for w in result.workers:
        assert w.steps == cfg.steps and w.throughput > 0
        assert 0 <= w.idle_s <= w.wall_s and 0 < w.compute_s <= w.wall_s
        assert {s.kind for s in w.spans} == {"compute", "idle", "send"}
        assert {s.rank for s in w.spans} == {result.topology.worker_ranks[w.worker]}
        starts = [s.start for s in w.spans]
        assert starts == sorted(starts) and all(s.start <= s.end for s in w.spans)
        assert len(w.curve_t) == cfg.steps // cfg.eval_every
        assert np.all(np.diff(w.curve_applied) >= 0)
    t, applied, acc = result.curve()
    assert np.all(np.diff(t) >= 0) and acc[-1] > acc[0]
    assert result.accuracy(load_digits().X_test, load_digits().y_test) > 0.8
