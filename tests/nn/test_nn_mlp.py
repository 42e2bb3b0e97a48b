"""The Numba MLP against the NumPy reference; flat buffer; per-layer API; bad input (chapter 1)."""

import numpy as np
import pytest

from coursekit.nn import MLP, gradcheck, reference
from coursekit.nn.activations import HIDDEN_ACTIVATIONS


def batch(sizes, n=7, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, sizes[0])).astype(dtype), rng.integers(0, sizes[-1], n)


@pytest.mark.parametrize("activation", HIDDEN_ACTIVATIONS)
@pytest.mark.parametrize("loss", ["softmax_xent", "mse"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_numba_loss_and_grad_matches_reference(activation, loss, dtype):
    sizes = (6, 9, 5, 4)
    mlp = MLP(sizes, activation, loss, dtype=dtype, seed=3)
    X, y = batch(sizes, dtype=dtype)
    target = y if loss == "softmax_xent" else np.eye(4, dtype=dtype)[y]  # mse one-hot encodes labels
    want_loss, want_grad = reference.loss_and_grad(
        mlp.params.astype(np.float64), sizes, activation, loss, X.astype(np.float64), target
    )
    got_loss, got_grad = mlp.loss_and_grad(X, y)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    assert got_grad.dtype == dtype and got_grad.shape == mlp.params.shape
    assert got_loss == pytest.approx(want_loss, rel=tol)
    np.testing.assert_allclose(got_grad, want_grad, rtol=tol * 10, atol=tol)


def test_mse_with_float_targets_matches_reference():
    sizes = (3, 8, 2)
    mlp = MLP(sizes, "tanh", "mse", dtype=np.float64, seed=1)
    rng = np.random.default_rng(5)
    X, T = rng.standard_normal((5, 3)), rng.standard_normal((5, 2))
    want = reference.loss_and_grad(mlp.params, sizes, "tanh", "mse", X, T)
    got = mlp.loss_and_grad(X, T)
    assert got[0] == pytest.approx(want[0])
    np.testing.assert_allclose(got[1], want[1], rtol=1e-12, atol=1e-14)


def test_forward_predict_accuracy_match_reference():
    sizes = (5, 7, 3)
    mlp = MLP(sizes, "sigmoid", seed=2, dtype=np.float64)
    X, y = batch(sizes, n=20, dtype=np.float64)
    out = reference.forward(mlp.params, sizes, "sigmoid", X)[-1]
    np.testing.assert_allclose(mlp.forward(X), out, rtol=1e-12)
    np.testing.assert_array_equal(mlp.predict(X), out.argmax(axis=1))
    assert mlp.accuracy(X, y) == pytest.approx(np.mean(out.argmax(axis=1) == y))


def test_params_is_one_flat_buffer_with_layer_views():
    mlp = MLP([4, 3, 2], seed=0)
    assert mlp.params.ndim == 1 and mlp.n_params == 4 * 3 + 3 + 3 * 2 + 2
    for layer in mlp.layers:
        assert np.shares_memory(layer.W, mlp.params) and np.shares_memory(layer.b, mlp.params)
        np.testing.assert_array_equal(mlp.params[layer.span], np.concatenate([layer.W.ravel(), layer.b]))
    mlp.params[:] = 0.5  # in-place changes (an allreduce, an SGD step) show in every layer
    assert np.all(mlp.layers[1].W == 0.5)
    X, _ = batch((4, 3, 2), dtype=np.float32)
    expected = (np.maximum(X @ np.full((4, 3), 0.5) + 0.5, 0) @ np.full((3, 2), 0.5)) + 0.5
    np.testing.assert_allclose(mlp.forward(X), expected, rtol=1e-6)


def test_sgd_step_written_naturally_updates_the_buffer_in_place():
    mlp = MLP([4, 3, 2], seed=0)
    buffer, before = mlp.params, mlp.params.copy()
    X, y = batch((4, 3, 2))
    _, grad = mlp.loss_and_grad(X, y)
    mlp.params -= 0.1 * grad
    assert mlp.params is buffer and np.shares_memory(mlp.layers[0].W, mlp.params)
    np.testing.assert_allclose(mlp.params, before - 0.1 * grad, rtol=1e-6)
    mlp.params = before  # assignment copies into the same buffer
    assert mlp.params is buffer
    np.testing.assert_array_equal(mlp.layers[0].W.ravel(), before[:12])
    with pytest.raises(ValueError, match=f"params takes {mlp.n_params} numbers"):
        mlp.params = np.zeros(5)


def test_initialization_is_seeded_and_scaled():
    a, b, c = MLP([200, 300, 10], seed=7), MLP([200, 300, 10], seed=7), MLP([200, 300, 10], seed=8)
    np.testing.assert_array_equal(a.params, b.params)
    assert not np.array_equal(a.params, c.params)
    assert np.std(a.layers[0].W) == pytest.approx(np.sqrt(2 / 200), rel=0.02)  # He for relu
    assert np.std(MLP([200, 300, 10], "tanh").layers[0].W) == pytest.approx(np.sqrt(1 / 200), rel=0.02)
    assert np.all(a.layers[0].b == 0)


def test_grad_out_buffer_is_reused():
    mlp = MLP([4, 3, 2], seed=0)
    X, y = batch((4, 3, 2))
    out = np.full_like(mlp.params, np.nan)
    _, g = mlp.loss_and_grad(X, y, out=out)
    assert g is out and np.isfinite(out).all()
    with pytest.raises(ValueError, match="out must be a C-contiguous float32 array of shape"):
        mlp.loss_and_grad(X, y, out=np.empty(3, np.float32))
    strided = np.empty(2 * mlp.n_params, np.float32)[::2]
    with pytest.raises(ValueError, match="got a strided float32"):
        mlp.loss_and_grad(X, y, out=strided)


@pytest.mark.parametrize("activation", ["relu", "sigmoid", "tanh", "identity"])
def test_layer_forward_and_backward_alone_match_reference(activation):
    """One layer at a time (for pipeline / tensor-parallel stages), given the upstream delta."""
    mlp = MLP([5, 6, 4], "relu" if activation == "identity" else activation, dtype=np.float64, seed=4)
    layer = mlp.layers[1] if activation == "identity" else mlp.layers[0]
    rng = np.random.default_rng(6)
    a_prev = rng.standard_normal((3, layer.W.shape[0]))
    a = layer.forward(a_prev)
    np.testing.assert_allclose(a, reference.layer_forward(layer.W, layer.b, a_prev, activation))
    grad_a = rng.standard_normal(a.shape)
    grad_a_copy = grad_a.copy()
    full = np.zeros_like(mlp.params)
    g_prev, g = layer.backward(a_prev, a, grad_a, grad=full[layer.span])
    dW, db, want_prev = reference.layer_backward(layer.W, a_prev, a, grad_a, activation)
    np.testing.assert_array_equal(grad_a, grad_a_copy)  # the caller's array is untouched
    np.testing.assert_allclose(g, np.concatenate([dW.ravel(), db]))
    np.testing.assert_allclose(full[layer.span], g)  # written into the flat gradient's range
    np.testing.assert_allclose(g_prev, want_prev)
    assert layer.backward(a_prev, a, grad_a, input_grad=False)[0] is None


def test_layers_chained_by_hand_equal_loss_and_grad():
    mlp = MLP([4, 5, 3], "tanh", dtype=np.float64, seed=9)
    X, y = batch((4, 5, 3), dtype=np.float64)
    acts = [X]
    for layer in mlp.layers:
        acts.append(layer.forward(acts[-1]))
    _, grad_a = reference.softmax_xent(acts[-1], y)
    grad = np.empty_like(mlp.params)
    for i in reversed(range(len(mlp.layers))):
        grad_a, _ = mlp.layers[i].backward(acts[i], acts[i + 1], grad_a, grad=grad[mlp.layers[i].span])
    np.testing.assert_allclose(grad, mlp.loss_and_grad(X, y)[1], rtol=1e-12)


def test_copy_is_independent_and_casts():
    mlp = MLP([3, 4, 2], seed=0)
    twin = mlp.copy(dtype=np.float64)
    assert twin.dtype == np.float64 and twin.params.dtype == np.float64
    np.testing.assert_array_equal(twin.params, mlp.params.astype(np.float64))
    twin.params[:] = 0
    assert np.any(mlp.params != 0)


@pytest.mark.parametrize("activation", HIDDEN_ACTIVATIONS)
def test_gradcheck_passes_on_the_mlp(activation):
    mlp = MLP([6, 8, 4], activation, seed=1)
    X, y = batch((6, 8, 4), n=5)
    result = gradcheck(mlp, X, y, n_checks=None)
    assert result.passed, str(result)
    assert len(result.indices) == mlp.n_params


def test_gradcheck_fails_on_a_wrong_gradient():
    class Broken(MLP):
        def loss_and_grad(self, X, y, **kw):
            loss, grad = super().loss_and_grad(X, y, **kw)
            grad[self.layers[0].span] *= 1.01  # a 1 % bug in the first layer
            return loss, grad

        def copy(self, dtype=None):
            twin = Broken(self.sizes, self.activation, self.loss, dtype=dtype or self.dtype)
            twin.params[...] = self.params
            return twin

    X, y = batch((5, 6, 3))
    result = gradcheck(Broken([5, 6, 3], seed=0), X, y, n_checks=40, seed=1)
    assert not result.passed and result.max_rel_error > 1e-3
    assert "FAILED" in str(result)


BAD_INPUTS = [
    (lambda m: m.loss_and_grad(np.zeros((2, 5)), [0, 1]), ValueError, r"5 features.*sizes\[0\] is 4"),
    (lambda m: m.loss_and_grad(np.zeros((2, 4)), [0, 3]), ValueError, r"y \(labels\) must lie in \[0, 3\)"),
    (lambda m: m.loss_and_grad(np.zeros((2, 4)), [-1, 0]), ValueError, r"\[0, 3\)"),
    (lambda m: m.loss_and_grad(np.full((2, 4), np.nan), [0, 1]), ValueError, "X contains NaN"),
    (lambda m: m.loss_and_grad(np.zeros((2, 4)), [0.0, 1.0]), TypeError, "integer class labels"),
    (lambda m: m.loss_and_grad(np.zeros((2, 4)), [0, 1, 2]), ValueError, "one label per row"),
    (lambda m: m.loss_and_grad(np.zeros(4), [0]), ValueError, "X must be 2-D"),
    (lambda m: m.predict(np.zeros((0, 4))), ValueError, "no rows"),
    (lambda m: m.forward(np.array([[np.inf, 0, 0, 0]])), ValueError, "NaN or infinite"),
    # the cheap checks (one compiled pass each) keep the same guarantees
    (lambda m: m.loss_and_grad(np.zeros((2, 4), np.float32), np.array([0, 2**64 - 1], np.uint64)), ValueError,
     r"\[0, 3\).*got values from 0 to 18446744073709551615"),
    (lambda m: m.loss_and_grad(np.zeros((2, 4), np.float32), np.array([0, -1], ">i8")), ValueError,
     r"\[0, 3\).*got values from -1 to 0"),
    (lambda m: m.loss_and_grad(np.zeros((2, 4), np.float32), np.array([0, 1], np.int8) - 2), ValueError,
     r"\[0, 3\)"),
    (lambda m: m.loss_and_grad(np.zeros((2, 4), np.float32), np.array([True, False])), TypeError,
     "integer class labels"),
    (lambda m: m.loss_and_grad(np.full((2, 4), 1e300), [0, 1]), ValueError, "NaN or infinite"),  # inf in float32
    (lambda m: m.loss_and_grad(np.asfortranarray(np.full((2, 4), -np.inf, np.float32)), [0, 1]), ValueError,
     "NaN or infinite"),
    (lambda m: m.loss_and_grad(np.zeros((2, 4), bool), [0, 1]), TypeError, "real numbers"),
    (lambda m: m.loss_and_grad(np.zeros((2, 4), complex), [0, 1]), TypeError, "real numbers"),
]


@pytest.mark.parametrize("call, error, match", BAD_INPUTS)
def test_bad_batches_get_clear_errors(call, error, match):
    with pytest.raises(error, match=match):
        call(MLP([4, 6, 3]))


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"sizes": [4, 0, 3]}, r"sizes\[1\]=0: every layer width must be a positive integer"),
        ({"activation": "softplus"}, "activation='softplus' is not supported; allowed: relu, sigmoid, tanh"),
        ({"activation": "identity"}, "allowed: relu, sigmoid, tanh"),
        ({"loss": "hinge"}, "loss='hinge' is not supported; allowed: softmax_xent, mse"),
        ({"dtype": np.float16}, "dtype=.* allowed: float32, float64"),
        ({"device": "tpu"}, "device='tpu' is not supported; allowed: cpu, cuda, auto"),
    ],
)
def test_bad_constructor_arguments_are_named(kwargs, match):
    args = {"sizes": [4, 6, 3], **kwargs}
    with pytest.raises(ValueError, match=match):
        MLP(args.pop("sizes"), **args)


def test_checked_path_converts_any_real_layout_and_keeps_large_finite_values():
    mlp = MLP([4, 6, 3], seed=0)
    X, y = batch((4, 6, 3), n=5)
    want_loss, want_grad = mlp.loss_and_grad(X, y, out=np.empty_like(mlp.params), validate=False)
    for X_in, y_in in [
        (X, y),
        (np.asfortranarray(X), y.astype(np.uint8)),
        (X.astype(">f4"), y.astype(">i4")),
        (X.astype(np.float64), list(y)),
    ]:
        loss, grad = mlp.loss_and_grad(X_in, y_in)
        assert loss == pytest.approx(want_loss, rel=1e-6)
        np.testing.assert_allclose(grad, want_grad, rtol=1e-6)
    big = np.full((2, 4), 3e38, np.float32)  # finite, though a sum (or sum of squares) of it is not
    assert np.isfinite(mlp.check_inputs(big)).all()
    X[1, 2] = np.nan  # one NaN among finite values, the last row too
    with pytest.raises(ValueError, match="X contains NaN"):
        mlp.loss_and_grad(X, y)


def test_mse_targets_shape_is_checked():
    mlp = MLP([4, 3], loss="mse")
    with pytest.raises(ValueError, match=r"y \(targets\) has shape \(2, 2\); expected \(2, 3\)"):
        mlp.loss_and_grad(np.zeros((2, 4)), np.zeros((2, 2)))
    with pytest.raises(ValueError, match=r"y \(targets\) contains NaN"):
        mlp.loss_and_grad(np.zeros((2, 4)), np.full((2, 3), np.nan))


def test_wide_layers_match_reference():
    """A 300 x 300 layer takes the kernels' large-weight branch (no transposed copy)."""
    sizes = (5, 300, 300, 3)
    mlp = MLP(sizes, "relu", dtype=np.float64, seed=2)
    X, y = batch(sizes, n=4, dtype=np.float64)
    want = reference.loss_and_grad(mlp.params, sizes, "relu", "softmax_xent", X, y)
    got = mlp.loss_and_grad(X, y)
    assert got[0] == pytest.approx(want[0], rel=1e-12)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-9, atol=1e-12)


def test_an_mlp_pickles_with_its_weights_and_stays_independent():
    import pickle
    mlp = MLP([5, 7, 3], "tanh", "mse", dtype=np.float64, seed=4)
    twin = pickle.loads(pickle.dumps(mlp))
    assert (twin.sizes, twin.activation, twin.loss, twin.dtype) == (mlp.sizes, "tanh", "mse",
                                                                    np.float64)
    np.testing.assert_array_equal(twin.params, mlp.params)
    twin.params += 1.0
    assert not np.shares_memory(twin.params, mlp.params)
    X = np.ones((2, 5))
    np.testing.assert_array_equal(twin.layers[0].W, twin.params[:35].reshape(5, 7))
    assert twin.forward(X).shape == (2, 3)


def test_softmax_exponentials_are_within_an_ulp_of_exp():
    from numba import njit

    from coursekit.nn import kernels_cpu

    @njit
    def exp_inplace(v):
        kernels_cpu._exp_inplace(v)

    x = np.concatenate([-np.linspace(0, 87.3, 100_001), [-0.0, -87.4, -1e30, -np.inf, np.nan]])
    x = x.astype(np.float32).astype(np.float64)  # arguments a float32 array can hold
    want = np.exp(x)
    got32 = x.astype(np.float32)
    exp_inplace(got32)
    normal = want >= 2.0**-126
    rel = np.abs(got32[normal] - want[normal]) / want[normal]
    assert rel.max() < 1.2e-7, rel.max()  # float32 rounding alone is up to 6e-8
    below = ~normal & ~np.isnan(x)
    np.testing.assert_allclose(got32[below], 2.0**-126, rtol=1e-5)  # the documented floor
    assert np.isnan(got32[-1])
    got64 = x.copy()
    exp_inplace(got64)  # float64 keeps libm's exp (NumPy's may differ from it by an ulp)
    np.testing.assert_allclose(got64, want, rtol=5e-16, atol=0)


def test_softmax_of_far_apart_logits_matches_reference():
    # weights 300x the initial scale: logits hundreds apart, so most exponentials underflow
    sizes = (6, 9, 5)
    mlp = MLP(sizes, "tanh", seed=4)
    mlp.params *= 300
    X, y = batch(sizes, n=16, seed=4)
    params, X64 = mlp.params.astype(np.float64), X.astype(np.float64)
    logits = reference.forward(params, sizes, "tanh", X64)[-1]
    assert np.ptp(logits, axis=1).min() > 100
    want_loss, want_grad = reference.loss_and_grad(params, sizes, "tanh", "softmax_xent", X64, y)
    got_loss, got_grad = mlp.loss_and_grad(X, y)
    assert got_loss == pytest.approx(want_loss, rel=1e-5)
    np.testing.assert_allclose(got_grad, want_grad, rtol=1e-4, atol=1e-3 * np.abs(want_grad).max())
