"""Numba CPU kernels for the MLP: BLAS through ``np.dot`` for the matrix products,
every elementwise step fused into one loop, the whole network in one compiled call.

Same equations as :mod:`coursekit.nn.reference` (read that first), same flat layout as
:mod:`coursekit.nn.layout`. Why it is fast (measured in ``bench/bench_mlp.py``):

* one call from Python per training step: the layer loop runs compiled, so there is no
  interpreter overhead per layer (for a 64-128-10 net that overhead dominates NumPy);
* ``np.dot`` inside ``@njit`` calls the same BLAS sgemm/dgemm NumPy uses, writing
  straight into the per-layer views of the flat gradient buffer (``out=``);
* bias + activation, delta = G * sigma'(A), the bias gradient and the softmax +
  cross-entropy are single passes over memory instead of NumPy's one temporary per op.

All functions are ``@njit(cache=True)``, so the second Python session loads machine
code from ``__pycache__`` instead of compiling again. None is also compiled with
``parallel=True``: caching one function under both would collide (see DESIGN.md).
TIP: ``NUMBA_DISABLE_JIT=1`` runs these as plain Python, for stepping through in a debugger.

Activation codes: 0 identity, 1 relu, 2 sigmoid, 3 tanh (:mod:`coursekit.nn.activations`).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

__all__ = [
    "all_finite",
    "forward",
    "labels_in_range",
    "layer_backward",
    "layer_forward",
    "loss_and_grad_mse",
    "loss_and_grad_xent",
    "momentum_update",
    "sgd_update",
]


_SMALL_W = 65536  # weights (256 KiB of float32) up to which layer_backward transposes W first


@njit(cache=True)
def _bias_act(Z, b, act):
    """In place: Z <- sigma(Z + b), one pass (the branch is outside the loops)."""
    n, m = Z.shape
    if act == 0:
        for i in range(n):
            for j in range(m):
                Z[i, j] += b[j]
    elif act == 1:
        for i in range(n):
            for j in range(m):
                Z[i, j] = max(Z[i, j] + b[j], 0)
    elif act == 2:
        for i in range(n):
            for j in range(m):
                z = Z[i, j] + b[j]
                if z >= 0:
                    Z[i, j] = 1 / (1 + math.exp(-z))
                else:
                    e = math.exp(z)
                    Z[i, j] = e / (1 + e)
    else:
        for i in range(n):
            for j in range(m):
                Z[i, j] = math.tanh(Z[i, j] + b[j])


@njit(cache=True)
def _delta_and_bias_grad(G, A, act, db):
    """In place: G <- G * sigma'(A) (sigma' written with the output A); db <- column sums.

    One branch per row, then branch-free inner loops that the compiler vectorizes.
    """
    n, m = G.shape
    db[:] = 0
    for i in range(n):
        if act == 1:
            for j in range(m):
                G[i, j] *= A[i, j] > 0
        elif act == 2:
            for j in range(m):
                G[i, j] *= A[i, j] * (1 - A[i, j])
        elif act == 3:
            for j in range(m):
                G[i, j] *= 1 - A[i, j] * A[i, j]
        for j in range(m):
            db[j] += G[i, j]


@njit(cache=True)
def layer_forward(W, b, A_prev, act, out):
    """out <- sigma(A_prev W + b); ``out`` is (n, n_out), C-contiguous."""
    np.dot(A_prev, W, out)
    _bias_act(out, b, act)
    return out


@njit(cache=True)
def layer_backward(W, A_prev, A, G, act, dW, db, G_prev):
    """One layer's backward pass given G = dC/dA (overwritten with delta = G * sigma'(A)).

    dW <- A_prev^T delta, db <- column sums of delta, and, when ``G_prev`` has rows,
    G_prev <- delta W^T = dC/dA_prev (pass an empty (0, 0) array to skip it, e.g. for layer 1).
    """
    _delta_and_bias_grad(G, A, act, db)
    np.dot(A_prev.T, G, dW)
    if G_prev.shape[0] > 0:
        if W.size <= _SMALL_W:
            # OpenBLAS's small-matrix path runs G @ W^T about 2x slower than G @ (a C-ordered
            # copy of W^T); for a small W the copy costs far less (measured: -1 us of ~16 us
            # per 64-128-10 step). For a big W the copy would cost as much as the product.
            np.dot(G, np.ascontiguousarray(W.T), G_prev)
        else:
            np.dot(G, W.T, G_prev)


@njit(cache=True)
def _layer_view(flat, sizes, layer):
    """(W, b) views of ``layer`` in the flat buffer (see coursekit.nn.layout)."""
    start = 0
    for i in range(layer):
        start += sizes[i + 1] * (sizes[i] + 1)
    n_in, n_out = sizes[layer], sizes[layer + 1]
    w_stop = start + n_out * n_in
    return flat[start:w_stop].reshape((n_in, n_out)), flat[w_stop : w_stop + n_out]


@njit(cache=True)
def _forward_all(params, sizes, act, X):
    """[X, A^1, ..., A^L]; hidden layers use ``act``, the output layer is linear."""
    n_layers = len(sizes) - 1
    acts = [X]
    for layer in range(n_layers):
        W, b = _layer_view(params, sizes, layer)
        out = np.empty((X.shape[0], sizes[layer + 1]), dtype=X.dtype)
        layer_forward(W, b, acts[layer], act if layer < n_layers - 1 else 0, out)
        acts.append(out)
    return acts


@njit(cache=True)
def _backward_all(params, grad, sizes, act, acts, G):
    """Backward through every layer, starting from G = delta^L (overwritten), into ``grad``."""
    n_layers = len(sizes) - 1
    empty = np.empty((0, 0), dtype=G.dtype)
    for layer in range(n_layers - 1, -1, -1):
        W, _ = _layer_view(params, sizes, layer)
        dW, db = _layer_view(grad, sizes, layer)
        if layer > 0:
            G_prev = np.empty((G.shape[0], sizes[layer]), dtype=G.dtype)
        else:
            G_prev = empty
        layer_backward(
            W, acts[layer], acts[layer + 1], G, act if layer < n_layers - 1 else 0, dW, db, G_prev
        )
        G = G_prev


@njit(cache=True)
def forward(params, sizes, act, X):
    """The network's output A^L (logits for softmax cross-entropy)."""
    return _forward_all(params, sizes, act, X)[-1]


@njit(cache=True)
def _softmax_xent_delta(Z, y):
    """In place Z <- (softmax(Z) - onehot(y)) / n; returns the mean cross-entropy (float64)."""
    n, m = Z.shape
    total = 0.0
    for i in range(n):
        zmax = Z[i, 0]
        for j in range(1, m):
            zmax = max(zmax, Z[i, j])
        shifted_target = Z[i, y[i]] - zmax
        s = 0.0
        for j in range(m):
            e = math.exp(Z[i, j] - zmax)
            Z[i, j] = e
            s += e
        total += math.log(s) - shifted_target
        inv = 1.0 / (s * n)
        for j in range(m):
            Z[i, j] *= inv
        Z[i, y[i]] -= 1.0 / n
    return total / n


@njit(cache=True)
def _mse_delta(Z, T):
    """In place Z <- (Z - T) / n; returns (1/(2n)) sum ||Z - T||^2 (float64)."""
    n, m = Z.shape
    total = 0.0
    for i in range(n):
        for j in range(m):
            d = Z[i, j] - T[i, j]
            total += d * d
            Z[i, j] = d / n
    return 0.5 * total / n


@njit(cache=True)
def loss_and_grad_xent(params, grad, sizes, act, X, y):
    """Mean softmax cross-entropy of labels ``y``; writes dC/dparams into ``grad``."""
    acts = _forward_all(params, sizes, act, X)
    loss = _softmax_xent_delta(acts[-1], y)
    _backward_all(params, grad, sizes, act, acts, acts[-1])
    return loss


@njit(cache=True)
def loss_and_grad_mse(params, grad, sizes, act, X, T):
    """Mean (1/2) squared error against targets ``T``; writes dC/dparams into ``grad``."""
    acts = _forward_all(params, sizes, act, X)
    loss = _mse_delta(acts[-1], T)
    _backward_all(params, grad, sizes, act, acts, acts[-1])
    return loss


@njit(cache=True)
def sgd_update(params, grad, lr):
    """params <- params - lr * grad."""
    for i in range(params.size):
        params[i] -= lr * grad[i]


@njit(cache=True)
def momentum_update(params, grad, velocity, lr, mu):
    """v <- mu v + grad; params <- params - lr v (PyTorch's convention)."""
    for i in range(params.size):
        v = mu * velocity[i] + grad[i]
        velocity[i] = v
        params[i] -= lr * v


# -- input checks (``MLP.check_inputs`` / ``check_targets``): one compiled pass each --------
# NumPy needs a temporary and two calls for ``np.isfinite(X).all()`` and two reductions for a
# label range; on the 64-128-10 net, batch 32, those checks cost about a third of the step.


@njit(cache=True)
def all_finite(a):
    """True when no element of the C-contiguous float array ``a`` is NaN or infinite."""
    flat = a.reshape(-1)
    ok = True
    for i in range(flat.size):
        ok &= math.isfinite(flat[i])  # no early exit: the loop vectorizes
    return ok


@njit(cache=True)
def labels_in_range(y, n_classes):
    """True when every label of the 1-D integer array ``y`` lies in [0, n_classes)."""
    bad = False
    for i in range(y.size):
        bad |= (y[i] < 0) | (y[i] >= n_classes)
    return not bad
