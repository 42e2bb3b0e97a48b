"""The speed harness compares like with like (no timing assertions; numbers go in bench/)."""

import numpy as np
import pytest

from coursekit.nn import MLP
from coursekit.nn.speed import (
    TightNumpyStep,
    best_time,
    measure_bandwidth,
    measure_matmul_peak,
    products_only,
    single_thread,
    training_steps,
)


@pytest.mark.parametrize("activation", ["relu", "sigmoid", "tanh"])
@pytest.mark.parametrize("sizes", [(6, 8, 3), (6, 8, 5, 3), (6, 3)])
def test_contestants_take_the_same_step(activation, sizes):
    mlp = MLP(sizes, activation, seed=0)
    assert MLP(sizes).activation == "relu"  # the default the benchmark runs: covered here
    rng = np.random.default_rng(0)
    X, y = rng.standard_normal((5, sizes[0])).astype(np.float32), rng.integers(0, sizes[-1], 5)
    initial = mlp.params.copy()
    steps = training_steps(mlp, X, y, lr=0.5, torch=False)
    assert list(steps) == ["numba", "numpy (tight)", "numpy (reference)"]
    for n_more in (1, 3):  # compare after one step and after four
        for _ in range(n_more):
            for step in steps.values():
                step()
        numba = steps["numba"].params
        # the step moves the parameters far more than the tolerance, so a wrong step fails
        assert np.abs(numba - initial).max() > 1e-2
        for name in ("numpy (tight)", "numpy (reference)"):
            np.testing.assert_allclose(steps[name].params, numba, rtol=1e-5, atol=1e-6, err_msg=name)
    manual = mlp.copy()
    for _ in range(4):
        manual.params[...] -= np.float32(0.5) * manual.loss_and_grad(X, y)[1]
    np.testing.assert_allclose(steps["numba"].params, manual.params, rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(mlp.params, initial)  # each contestant works on its own copy


def test_tight_numpy_step_returns_the_loss_and_detects_a_wrong_step():
    mlp = MLP([6, 8, 3], seed=0)
    rng = np.random.default_rng(2)
    X, y = rng.standard_normal((5, 6)).astype(np.float32), rng.integers(0, 3, 5)
    want_loss, want_grad = mlp.loss_and_grad(X, y)
    tight = TightNumpyStep(mlp.params.copy(), mlp.sizes, "relu", 5, lr=0.5)
    assert tight(X, y) == pytest.approx(want_loss, rel=1e-5)
    np.testing.assert_allclose(tight.params, mlp.params - np.float32(0.5) * want_grad, rtol=1e-5, atol=1e-6)
    # the same comparison fails for a step on other labels: the tolerance is not vacuous
    other = TightNumpyStep(mlp.params.copy(), mlp.sizes, "relu", 5, lr=0.5)
    other(X, (y + 1) % 3)
    assert not np.allclose(other.params, tight.params, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="activation='identity' is not supported"):
        TightNumpyStep(mlp.params.copy(), mlp.sizes, "identity", 5, lr=0.5)


@pytest.mark.slow  # imports PyTorch
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


@pytest.mark.parametrize("sizes", [(6, 8, 3), (6, 8, 5, 3), (6, 3), (300, 400, 2)])  # last: W^T as a view
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_products_only_computes_the_steps_products(sizes, dtype):
    mlp = MLP(sizes, seed=1, dtype=dtype)
    run = products_only(mlp, 5)
    run()  # grad starts at zero and the deltas below the top are random: all must be written
    A, D = run.acts, run.deltas
    tol = 1e-4 if dtype == np.float32 else 1e-12
    for i, layer in enumerate(mlp.layers):
        np.testing.assert_allclose(A[i + 1], A[i] @ layer.W, rtol=tol, atol=tol)
        dW = run.grad[layer.span][: layer.W.size].reshape(layer.W.shape)
        np.testing.assert_allclose(dW, A[i].T @ D[i + 1], rtol=tol, atol=tol)
        if i > 0:
            np.testing.assert_allclose(D[i], D[i + 1] @ layer.W.T, rtol=tol, atol=tol)
    with pytest.raises(TypeError, match="model must be a CPU"):
        products_only("mlp", 5)
    with pytest.raises(ValueError, match="batch"):
        products_only(mlp, 0)


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
