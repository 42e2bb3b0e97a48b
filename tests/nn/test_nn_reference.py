"""The NumPy reference against finite differences and closed forms (chapter 1)."""

import numpy as np
import pytest

from coursekit.nn import activations, layout, reference


def numeric_grad(f, x, eps=1e-6):
    """Central differences of the scalar f() with respect to every entry of x (in place)."""
    g = np.empty_like(x)
    for i in np.ndindex(x.shape):
        saved = x[i]
        x[i] = saved + eps
        plus = f()
        x[i] = saved - eps
        minus = f()
        x[i] = saved
        g[i] = (plus - minus) / (2 * eps)
    return g


@pytest.mark.parametrize("name", activations.ACTIVATIONS)
def test_derivative_from_output_matches_finite_differences(name):
    z = np.random.default_rng(0).uniform(-3, 3, 50)
    z = z[np.abs(z) > 1e-3]  # away from relu's kink
    a = activations.apply(z, name)
    eps = 1e-6
    numeric = (activations.apply(z + eps, name) - activations.apply(z - eps, name)) / (2 * eps)
    np.testing.assert_allclose(activations.derivative(a, name), numeric, rtol=1e-6, atol=1e-8)


def test_activation_values_match_closed_forms():
    z = np.linspace(-30, 30, 61)
    np.testing.assert_allclose(activations.apply(z, "sigmoid"), 1 / (1 + np.exp(-z)), rtol=1e-12)
    np.testing.assert_array_equal(activations.apply(z, "relu"), np.where(z > 0, z, 0))
    np.testing.assert_allclose(activations.apply(z, "tanh"), np.tanh(z))


def test_unknown_activation_names_the_argument():
    with pytest.raises(ValueError, match="activation='gelu'.*relu, sigmoid, tanh"):
        activations.apply(np.zeros(2), "gelu")


def test_softmax_xent_matches_direct_formula_and_is_stable():
    rng = np.random.default_rng(1)
    z, y = rng.standard_normal((5, 4)), rng.integers(0, 4, 5)
    p = np.exp(z) / np.exp(z).sum(axis=1, keepdims=True)
    loss, delta = reference.softmax_xent(z, y)
    assert loss == pytest.approx(-np.mean(np.log(p[np.arange(5), y])))
    onehot = np.eye(4)[y]
    np.testing.assert_allclose(delta, (p - onehot) / 5)
    big_loss, _ = reference.softmax_xent(z + 1000.0, y)  # shift invariance, no overflow
    assert big_loss == pytest.approx(loss)


def test_mse_matches_lecture_cost():
    rng = np.random.default_rng(2)
    out, t = rng.standard_normal((3, 2)), rng.standard_normal((3, 2))
    loss, delta = reference.mse(out, t)
    assert loss == pytest.approx(np.mean(0.5 * np.sum((t - out) ** 2, axis=1)))
    np.testing.assert_allclose(delta, (out - t) / 3)


@pytest.mark.parametrize("activation", activations.HIDDEN_ACTIVATIONS)
@pytest.mark.parametrize("loss", ["softmax_xent", "mse"])
def test_reference_gradient_matches_finite_differences(activation, loss):
    rng = np.random.default_rng(3)
    sizes = (4, 5, 3, 3)
    params = rng.standard_normal(layout.n_params(sizes)) * 0.7
    X = rng.standard_normal((6, 4))
    y = rng.integers(0, 3, 6) if loss == "softmax_xent" else rng.standard_normal((6, 3))
    _, grad = reference.loss_and_grad(params, sizes, activation, loss, X, y)
    numeric = numeric_grad(lambda: reference.loss_and_grad(params, sizes, activation, loss, X, y)[0], params)
    np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-8)


def test_layer_backward_is_the_lecture_equations_per_sample():
    """Batch form == the lecture's per-sample column equations summed over samples."""
    rng = np.random.default_rng(4)
    Wl, b = rng.standard_normal((3, 4)), rng.standard_normal(3)  # the lecture's W^l: (n_l, n_{l-1})
    W = Wl.T  # ours: (n_in, n_out), one sample per row
    a_prev, grad_a = rng.standard_normal((5, 4)), rng.standard_normal((5, 3))
    z = np.stack([Wl @ a_prev[x] + b for x in range(5)])  # z^l = W^l a^{l-1} + b^l
    a = np.tanh(z)
    dW, db, g_prev = reference.layer_backward(W, a_prev, a, grad_a, "tanh")
    dW_sum = np.zeros_like(Wl)
    for x in range(5):
        delta = grad_a[x] * (1 - np.tanh(z[x]) ** 2)  # delta^l = G * sigma'(z^l)
        dW_sum += np.outer(delta, a_prev[x])  # dC/dW = delta (a^{l-1})^T
        np.testing.assert_allclose(g_prev[x], Wl.T @ delta)  # (W^l)^T delta^l
    np.testing.assert_allclose(dW, dW_sum.T)
    np.testing.assert_allclose(db, (grad_a * (1 - a**2)).sum(axis=0))


def test_layout_views_are_contiguous_ranges_of_the_flat_buffer():
    sizes = (3, 4, 2)
    flat = np.arange(layout.n_params(sizes), dtype=float)
    assert flat.size == 4 * 3 + 4 + 2 * 4 + 2
    (W1, b1), (W2, b2) = layout.views(flat, sizes)
    np.testing.assert_array_equal(W1.ravel(), np.arange(12))
    np.testing.assert_array_equal(b1, np.arange(12, 16))
    np.testing.assert_array_equal(W2.ravel(), np.arange(16, 24))
    W2[0, 0] = -1
    assert flat[16] == -1
    spans = [s.slice for s in layout.layer_slices(sizes)]
    assert spans == [slice(0, 16), slice(16, 26)]


@pytest.mark.parametrize(
    "sizes, error, match",
    [
        ([64, 0, 10], ValueError, r"sizes\[1\]=0"),
        ([64], ValueError, "at least an input and an output"),
        ([64, 2.5, 10], TypeError, r"sizes\[1\]=2.5"),
        (7, TypeError, "sequence"),
    ],
)
def test_bad_sizes_are_named(sizes, error, match):
    with pytest.raises(error, match=match):
        layout.check_sizes(sizes)
