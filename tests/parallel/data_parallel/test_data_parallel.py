"""Synchronous data-parallel SGD == serial SGD on the concatenated batch (float64).

The reference is chapter 1's :func:`coursekit.nn.train` (written independently): same
seed for the weights and the shuffling, batch size = the global batch B. Workers run on
ThreadComm ranks (``data_parallel.train`` on a ``LocalRunner``).
"""

from dataclasses import replace

import numpy as np
import pytest

from coursekit import costmodel
from coursekit.collectives import ALGORITHMS
from coursekit.nn import MLP, SGD, train
from coursekit.parallel import data_parallel
from coursekit.parallel.data_parallel import DPConfig
from coursekit.parallel.data_parallel.strategies import predict_bytes_sent, predict_bytes_through
from coursekit.parallel.data_parallel.lr_rules import LRSchedule
from coursekit.cluster.runner import LocalRunner

THREADS = LocalRunner(8)  # each run uses its first `workers` ranks

TOL = dict(rtol=1e-10, atol=1e-12)


@pytest.fixture(scope="module")
def digits(digits_f64):
    d = digits_f64
    return d.X_train[:301], d.y_train[:301], d.X_test, d.y_test


def base(**kw):
    cfg = DPConfig(sizes=(64, 16, 10), dtype="float64", batch_size=30, epochs=2, lr=0.1, seed=7,
                   publish_interval=0.0)
    return replace(cfg, **kw)


def serial(cfg, X, y, optimizer=None):
    mlp = MLP(cfg.sizes, cfg.activation, cfg.loss, dtype=np.float64, seed=cfg.seed)
    history = train(mlp, X, y, epochs=cfg.epochs, batch_size=cfg.batch_size, lr=cfg.lr,
                    momentum=cfg.momentum, seed=cfg.seed,
                    optimizer=None if optimizer is None else optimizer(mlp.params))
    return mlp.params, history.step_loss


@pytest.mark.parametrize("n", [1, 2, 3, 4])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_sync_allreduce_equals_serial_training_on_the_concatenated_batch(digits, n, momentum):
    X, y, *_ = digits
    cfg = base(momentum=momentum)  # 301 rows / B=30: the last batch has 1 row, so 3 ranks idle
    want, want_loss = serial(cfg, X, y)
    got = data_parallel.train(THREADS, cfg, (X, y), workers=n)
    np.testing.assert_allclose(got.params, want, **TOL)
    np.testing.assert_allclose(got.loss, want_loss, **TOL)
    assert got.local_loss.shape == (n, len(want_loss))
    np.testing.assert_allclose(got.weight.sum(axis=0), 1.0)
    if n == 4:
        assert (got.weight[:, 10] == [1, 0, 0, 0]).all()  # the 1-row batch: rank 0 only


@pytest.mark.parametrize("algorithm", ALGORITHMS["allreduce"])
def test_every_chapter_2_algorithm_gives_the_serial_parameters(digits, algorithm):
    X, y, *_ = digits
    cfg = base(algorithm=algorithm, epochs=1)
    got = data_parallel.train(THREADS, cfg, (X, y), workers=3)
    np.testing.assert_allclose(got.params, serial(cfg, X, y)[0], **TOL)


@pytest.mark.parametrize("n", [2, 3, 4])
def test_parameter_server_equals_allreduce(digits, n):
    X, y, *_ = digits
    cfg = base(momentum=0.9)
    ps = data_parallel.train(THREADS, replace(cfg, exchange="ps"), (X, y), workers=n)
    ar = data_parallel.train(THREADS, cfg, (X, y), workers=n)
    np.testing.assert_allclose(ps.params, ar.params, **TOL)
    np.testing.assert_allclose(ps.loss, ar.loss, **TOL)


def test_averaging_every_step_is_sync_sgd_and_every_k_steps_is_not(digits):
    X, y, *_ = digits
    cfg = base()
    sync = data_parallel.train(THREADS, cfg, (X, y), workers=3).params
    np.testing.assert_allclose(data_parallel.train(THREADS, replace(cfg, exchange="average"),
                                                   (X, y), workers=3).params,
                               sync, **TOL)
    local_sgd = data_parallel.train(THREADS, replace(cfg, exchange="average", average_every=4),
                                    (X, y), workers=3)
    assert not np.allclose(local_sgd.params, sync, rtol=1e-6)  # a different algorithm ...
    assert np.isfinite(local_sgd.params).all()                 # ... still one model at the end


@pytest.mark.parametrize("bucket_bytes", [None, 4096])
def test_the_layer_by_layer_backward_equals_serial_without_overlap(digits, bucket_bytes):
    """backward="layers": the overlapped path's NumPy kernel, used without overlap (chapter 3
    times all three bucket variants with the same kernel)."""
    X, y, *_ = digits
    cfg = base(bucket_bytes=bucket_bytes, overlap=False, backward="layers", momentum=0.9)
    got = data_parallel.train(THREADS, cfg, (X, y), workers=3)
    np.testing.assert_allclose(got.params, serial(cfg, X, y)[0], **TOL)
    assert {"forward", "backward"} <= {s.kind for s in got.spans}
    with pytest.raises(ValueError, match="backward='auto'"):
        replace(cfg, backward="auto")
    with pytest.raises(ValueError, match="backward='layers' runs in NumPy on the host"):
        replace(cfg, bucket_bytes=None, backward="layers", device="cuda")


@pytest.mark.parametrize("overlap", [True, False])
@pytest.mark.parametrize("bucket_bytes", [512, 4096, 1 << 20])
def test_bucketed_allreduce_equals_serial(digits, bucket_bytes, overlap):
    X, y, *_ = digits
    cfg = base(bucket_bytes=bucket_bytes, overlap=overlap, momentum=0.9)
    got = data_parallel.train(THREADS, cfg, (X, y), workers=3)
    np.testing.assert_allclose(got.params, serial(cfg, X, y)[0], **TOL)
    kinds = {s.kind for s in got.spans}
    assert ({"forward", "backward"} <= kinds) == overlap
    n_buckets = -(-MLP(cfg.sizes).n_params * 8 // bucket_bytes)
    comm_spans = [s for s in got.spans if s.kind == "comm" and s.rank == 0]
    assert len(comm_spans) == cfg.timeline_steps * n_buckets  # one allreduce per bucket


def test_linear_warmup_follows_its_schedule(digits):
    X, y, *_ = digits
    cfg = base(lr=0.02, lr_rule="linear_warmup", warmup_steps=7)
    schedule = LRSchedule(cfg.lr, cfg.lr_rule, 4, cfg.warmup_steps)

    class Scheduled(SGD):  # serial SGD whose rate follows the schedule step by step
        t = 0

        def step(self, grad):
            self.lr = schedule(self.t)
            self.t += 1
            super().step(grad)

    got = data_parallel.train(THREADS, cfg, (X, y), workers=4)
    np.testing.assert_allclose(got.lr, [schedule(t) for t in range(len(got.lr))])
    np.testing.assert_allclose(got.params, serial(cfg, X, y, optimizer=Scheduled)[0], **TOL)


@pytest.mark.parametrize("exchange, algorithm", [("allreduce", "ring"), ("ps", "ring"),
                                                 ("allreduce", "reduce_bcast")])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_bytes_through_each_rank_match_the_cost_model(digits, exchange, algorithm, n):
    X, y, *_ = digits
    cfg = base(exchange=exchange, algorithm=algorithm, epochs=1)
    got = data_parallel.train(THREADS, cfg, (X, y), workers=n)
    nbytes = MLP(cfg.sizes).n_params * 8
    np.testing.assert_array_equal(got.bytes_sent(),
                                  predict_bytes_sent(exchange, algorithm, n, nbytes, itemsize=8))
    want = predict_bytes_through(exchange, algorithm, n, nbytes, itemsize=8)
    messages = costmodel.measured_traffic(got.traces).messages / cfg.timeline_steps
    # received ~ sent: equal chunks are exact, uneven ones differ by <= 1 element per message
    assert (np.abs(got.bytes_through() - want) <= 8 * messages).all()
    if exchange == "ps":  # the server moves N-1 times what a worker moves
        assert want[0] == (n - 1) * want[1] == 2 * (n - 1) * nbytes


def test_test_accuracy_is_reported_and_learning_happens(digits):
    X, y, X_test, y_test = digits
    cfg = base(epochs=6, eval_every=20, momentum=0.9)
    got = data_parallel.train(THREADS, cfg, (X, y), (X_test, y_test), workers=2)
    assert got.eval_steps.tolist() == [20, 40, 60, 66]  # and after the last step
    assert got.test_accuracy[-1] > 0.8
    assert got.loss[-5:].mean() < got.loss[:5].mean() / 3


def test_a_straggler_slows_every_rank_down(digits):
    """Not a timing assertion on speed: the straggler's compute spans are stretched by
    sleeping, so its compute is at least (factor - 1) times a normal rank's minimum."""
    X, y, *_ = digits
    got = data_parallel.train(THREADS, base(epochs=1, straggler_rank=1, slow_factor=5.0),
                              (X, y), workers=3)
    assert np.median(got.compute_s[1]) > 3 * np.median(got.compute_s[0])
    # synchronous: the fast ranks spend the difference waiting in the exchange
    waiting = got.step_s - got.compute_s
    assert np.median(waiting[0]) > np.median(waiting[1])


def test_predicted_comm_time_formulas():
    from coursekit.parallel.data_parallel.strategies import predict_comm
    a, b, n = 1e-5, 1e-9, 10**6
    assert predict_comm("allreduce", "ring", 1, n, a, b) == 0.0
    ring = predict_comm("allreduce", "ring", 4, n, a, b)
    assert ring == pytest.approx(6 * a + 1.5 * n * b)
    assert predict_comm("ps", "ring", 4, n, a, b) == pytest.approx(6 * a + 6 * n * b)
    assert predict_comm("average", "ring", 4, n, a, b, average_every=4) == pytest.approx(ring / 4)
    assert predict_comm("allreduce", "ring", 4, n, a, b, bucket_bytes=n // 4) == pytest.approx(
        4 * costmodel.predict("allreduce", "ring", 4, n // 4, a, b))


def test_averaging_sweep_equals_allreduce_at_k1_and_sends_its_bytes_over_k(digits):
    """Local SGD with k = 1 is the allreduce update (float64 rounding); a rank sends the
    allreduce's bytes once every k steps: per step costmodel.traffic's allreduce volume / k."""
    from coursekit.parallel.data_parallel.experiments import averaging_sweep

    X, y, Xt, yt = digits
    cfg = base(batch_size=32, epochs=3, max_steps=24)
    sweep = averaging_sweep(THREADS, cfg, (X, y), [1, 2, 4, 8], workers=3, eval_data=(Xt, yt))
    assert sweep.workers == 3 and sweep.allreduce.config.exchange == "allreduce"
    assert [r.config.average_every for r in sweep.runs] == [1, 2, 4, 8]
    np.testing.assert_allclose(sweep.runs[0].params, sweep.allreduce.params, **TOL)
    assert not np.allclose(sweep.runs[-1].params, sweep.allreduce.params, **TOL)  # k = 8 drifts
    volume = costmodel.traffic("allreduce", "ring", 3, 8 * MLP(cfg.sizes).n_params, itemsize=8).nbytes
    np.testing.assert_array_equal(sweep.bytes_sent, volume[None, :] / np.array([[1], [2], [4], [8]]))
    np.testing.assert_array_equal(sweep.predicted_bytes_sent, sweep.bytes_sent)
    assert sweep.accuracy.shape == sweep.final_loss.shape == (4,)
    with pytest.raises(ValueError, match="not a multiple of lcm"):
        averaging_sweep(THREADS, replace(cfg, max_steps=20), (X, y), [1, 8], workers=3)
    with pytest.raises(ValueError, match="every"):
        averaging_sweep(THREADS, cfg, (X, y), [], workers=3)
    with pytest.raises(ValueError, match="every"):
        averaging_sweep(THREADS, cfg, (X, y), [0], workers=3)
