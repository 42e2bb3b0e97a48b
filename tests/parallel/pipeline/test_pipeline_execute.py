"""The executor runs the same schedules over a Comm: gradients equal the serial MLP's."""

import numpy as np
import pytest

from coursekit.comm import run_local
from coursekit.nn import MLP
from coursekit.parallel.pipeline import I, Schedule, W, combine_ranks, execute, run_pipeline, schedule
from coursekit.cluster.runner import LocalRunner

THREADS = LocalRunner(8)  # a schedule of p stages runs on the first p ranks

CASES = [("gpipe", 1, 3, 1), ("gpipe", 4, 5, 1), ("1f1b", 2, 2, 1), ("1f1b", 4, 7, 1),
         ("interleaved_1f1b", 2, 4, 2), ("interleaved_1f1b", 2, 2, 4), ("zb_h1", 2, 3, 1),
         ("zb_h1", 4, 4, 1)]


def batch(n=13, n_in=6, n_classes=5, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, n_in)), rng.integers(0, n_classes, n)


@pytest.mark.parametrize("name,p,m,v", CASES)
@pytest.mark.parametrize("activation,loss", [("tanh", "softmax_xent"), ("relu", "mse")])
def test_pipelined_step_equals_serial_gradient(name, p, m, v, activation, loss):
    mlp = MLP([6, 7, 8, 7, 8, 7, 8, 7, 5], activation, loss, dtype=np.float64, seed=3)  # 8 layers
    X, y = batch()
    want_loss, want = mlp.loss_and_grad(X, y)
    run = run_pipeline(THREADS, schedule(name, p, m, chunks=v), (X, y), mlp=mlp)
    assert run.loss == pytest.approx(want_loss, rel=1e-12)
    np.testing.assert_allclose(run.grad, want, rtol=1e-10, atol=1e-13)


@pytest.mark.parametrize("recompute", [False, True])
def test_a_schedule_mixing_full_and_split_backwards_equals_serial(recompute):
    """1F1B where odd micro-batches run I and, at the end of each rank, W: each letter
    computes its part whatever the others do."""
    mlp = MLP([6, 7, 8, 7, 5], dtype=np.float64, seed=2)  # 4 layers, 2 per rank
    X, y = batch()
    p, m = 2, 4
    compute = [[I(a.stage, a.mb) if a.kind == "B" and a.mb % 2 else a for a in schedule("1f1b", p, m).compute(r)]
               + [W(r, i) for i in range(1, m, 2)] for r in range(p)]
    run = run_pipeline(THREADS, Schedule.from_compute("mixed", compute, m), (X, y), mlp=mlp,
                       recompute=recompute)
    want_loss, want = mlp.loss_and_grad(X, y)
    assert run.loss == pytest.approx(want_loss, rel=1e-12)
    np.testing.assert_allclose(run.grad, want, rtol=1e-10, atol=1e-13)
    assert {s.action.kind for spans in run.timeline for s in spans} == {"F", "B", "I", "W"}


def test_each_rank_fills_only_its_own_layers():
    mlp = MLP([6, 7, 8, 7, 5], dtype=np.float64, seed=1)  # 4 layers, 2 per rank
    X, y = batch()
    results = run_local(execute, 2, schedule("1f1b", 2, 3), mlp, X, y)
    split = mlp.layers[2].span.start
    assert np.all(results[0].grad[split:] == 0) and np.any(results[0].grad[:split] != 0)
    assert np.all(results[1].grad[:split] == 0) and np.any(results[1].grad[split:] != 0)
    assert results[0].loss == 0.0 and results[1].loss > 0


@pytest.mark.parametrize("name,p,m,v", CASES)
def test_measured_timeline_follows_the_schedule(name, p, m, v):
    mlp = MLP([6, 8, 8, 8, 8, 8, 8, 8, 5], dtype=np.float64, seed=0)
    X, y = batch()
    sched = schedule(name, p, m, chunks=v)
    run = run_pipeline(THREADS, sched, (X, y), mlp=mlp)
    assert min(s.start for spans in run.timeline for s in spans) == 0.0
    for r, spans in enumerate(run.timeline):
        assert [s.action for s in spans] == sched.compute(r)
        assert all(s.rank == r and 0 <= s.start <= s.end for s in spans)
        assert all(a.end <= b.start for a, b in zip(spans, spans[1:]))


def test_gather_adds_disjoint_parts():
    mlp = MLP([6, 8, 5], dtype=np.float64, seed=0)
    X, y = batch()
    parts = run_local(execute, 2, schedule("gpipe", 2, 2), mlp, X, y)
    run = combine_ranks(parts)
    np.testing.assert_array_equal(run.grad, parts[0].grad + parts[1].grad)


def test_float32_model_runs_in_float32():
    mlp = MLP([6, 8, 5], seed=0)
    X, y = batch()
    run = run_pipeline(THREADS, schedule("1f1b", 2, 4), (X, y), mlp=mlp)
    assert run.grad.dtype == np.float32
    np.testing.assert_allclose(run.grad, mlp.loss_and_grad(X, y)[1], rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("name,p,m,v", CASES)
def test_recomputation_gives_the_same_gradient_for_less_memory_and_one_more_forward(name, p, m, v):
    mlp = MLP([6, 7, 8, 7, 8, 7, 8, 7, 5], dtype=np.float64, seed=3)  # 8 layers
    X, y = batch()
    sched = schedule(name, p, m, chunks=v)
    kept = run_pipeline(THREADS, sched, (X, y), mlp=mlp)
    again = run_pipeline(THREADS, sched, (X, y), mlp=mlp, recompute=True)
    np.testing.assert_array_equal(again.grad, kept.grad)  # the same numbers, bit for bit
    assert again.loss == kept.loss
    layers_per_rank = 8 // p
    assert kept.layer_forwards == [layers_per_rank * m] * p
    assert again.layer_forwards == [2 * layers_per_rank * m] * p  # each stage's forward twice
    assert all(a <= k for a, k in zip(again.peak_activation_bytes, kept.peak_activation_bytes))
    if layers_per_rank > 1 and min(p, m) > 1:  # rank 0 holds several micro-batches at once
        assert again.peak_activation_bytes[0] < kept.peak_activation_bytes[0]


def test_recomputation_memory_follows_the_formula_for_gpipe():
    """One stage, GPipe, 4 micro-batches of 4 rows: without recomputation every layer output
    of every micro-batch is held at once, n (w_0 + ... + w_k); with it the stage inputs of
    all micro-batches, n w_0, plus one micro-batch's other outputs while it is recomputed."""
    widths = [6, 7, 8, 7, 5]
    mlp = MLP(widths, dtype=np.float64, seed=3)
    X, y = batch(n=16)
    sched = schedule("gpipe", 1, 4)
    kept = run_pipeline(THREADS, sched, (X, y), mlp=mlp).peak_activation_bytes[0]
    again = run_pipeline(THREADS, sched, (X, y), mlp=mlp, recompute=True).peak_activation_bytes[0]
    assert kept == 16 * sum(widths) * 8
    assert again == 16 * widths[0] * 8 + 4 * sum(widths[1:]) * 8


def test_recompute_must_be_a_bool():
    mlp = MLP([6, 8, 5], dtype=np.float64, seed=0)
    with pytest.raises(TypeError, match="recompute must be True or False"):
        run_pipeline(THREADS, schedule("gpipe", 1, 2), batch(), mlp=mlp, recompute="yes")


def never_called(*args, **kwargs):
    raise AssertionError("a rank started before the arguments were checked")


@pytest.mark.parametrize("runner_size, data, error, message", [
    (1, batch(), ValueError, r"the schedule has 2 ranks but LocalRunner\(1\) has 1"),
    (2, list(batch()), TypeError, r"data must be an \(X, y\) pair"),
    (2, batch()[0], TypeError, r"data must be an \(X, y\) pair"),
    (2, (batch()[0][:1], batch()[1][:1]), ValueError, "fewer than the 2 micro-batches"),
])
def test_bad_arguments_are_refused_before_any_rank_runs(monkeypatch, runner_size, data, error,
                                                        message):
    runner = LocalRunner(runner_size)
    monkeypatch.setattr(runner, "run", never_called)
    with pytest.raises(error, match=message):
        run_pipeline(runner, schedule("gpipe", 2, 2), data, mlp=MLP([6, 8, 5], seed=0))
