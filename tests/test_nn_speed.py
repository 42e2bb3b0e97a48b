"""The speed harness compares like with like (no timing assertions; numbers go in bench/)."""

import numpy as np
import pytest

from coursekit.nn import MLP
from coursekit.nn.speed import best_time, measure_bandwidth, measure_matmul_peak, single_thread, training_steps


def test_contestants_take_the_same_step():
    mlp = MLP([6, 8, 3], seed=0)
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((5, 6)).astype(np.float32), rng.integers(0, 3, 5)
    initial = mlp.params.copy()
    steps = training_steps(mlp, X, y, lr=0.1, torch=False)
    for _ in range(3):
        steps["numba"]()
        steps["numpy"]()
    np.testing.assert_allclose(steps["numba"].params, steps["numpy"].params, rtol=1e-5, atol=1e-6)
    manual = mlp.copy()
    for _ in range(3):
        manual.params[...] -= np.float32(0.1) * manual.loss_and_grad(X, y)[1]
    np.testing.assert_allclose(steps["numba"].params, manual.params, rtol=1e-6)
    np.testing.assert_array_equal(mlp.params, initial)  # each contestant works on its own copy


def test_pytorch_contestant_takes_the_same_step():
    torch = pytest.importorskip("torch")
    mlp = MLP([6, 8, 3], "tanh", seed=0)
    rng = np.random.default_rng(1)
    X, y = rng.standard_normal((5, 6)).astype(np.float32), rng.integers(0, 3, 5)
    steps = training_steps(mlp, X, y, lr=0.1)
    for _ in range(3):
        steps["numba"]()
        steps["pytorch"]()
    linears = [m for m in steps["pytorch"].net if isinstance(m, torch.nn.Linear)]
    # PyTorch stores weights as (out, in); our layout is (in, out), then the bias
    flat = torch.cat([t.detach().flatten() for m in linears for t in (m.weight.T, m.bias)]).numpy()
    np.testing.assert_allclose(flat, steps["numba"].params, rtol=1e-5, atol=1e-6)


def test_training_steps_rejects_mse():
    with pytest.raises(ValueError, match="softmax_xent"):
        training_steps(MLP([2, 2], loss="mse"), np.zeros((1, 2)), [0])


def test_measurements_return_positive_rates():
    calls = []
    assert best_time(lambda: calls.append(1), repeats=2, min_seconds=1e-3) > 0
    assert len(calls) > 2
    with single_thread():
        assert measure_matmul_peak(n=64, repeats=1) > 0
    assert measure_bandwidth(nbytes=2**16, repeats=1) > 0
