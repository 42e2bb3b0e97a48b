"""Numba CPU kernels for the MLP: BLAS through ``np.dot`` for the matrix products,
every elementwise step fused into one loop, the whole network in one compiled call.

Same equations as :mod:`coursekit.nn.reference` (read that first), same flat layout as
:mod:`coursekit.nn.layout`. Why it is fast (measured in ``bench/bench_mlp.py``):

* one call from Python per training step: the layer loop runs compiled, so there is no
  interpreter overhead per layer (for a 64-128-10 net that overhead dominates NumPy);
* ``np.dot`` inside ``@njit`` calls the same BLAS sgemm/dgemm NumPy uses, writing
  straight into the per-layer views of the flat gradient buffer (``out=``);
* bias + activation, delta = G * sigma'(A), the bias gradient and the softmax +
  cross-entropy are single passes over memory instead of NumPy's one temporary per op;
* the activations A^1..A^L live in one block allocated per step (:func:`_layer_output`
  carves the layers' views), and the softmax's exponentials are a polynomial the compiler
  vectorizes (:func:`_exp_inplace`) instead of one libm call per logit.

All functions are ``@njit(cache=True)``, so the second Python session loads machine
code from ``__pycache__`` instead of compiling again. None is also compiled with
``parallel=True``: caching one function under both would collide (see DESIGN.md).
TIP: ``NUMBA_DISABLE_JIT=1`` runs these as plain Python, for stepping through in a debugger.

Activation codes: 0 identity, 1 relu, 2 sigmoid, 3 tanh (:mod:`coursekit.nn.activations`).
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, types
from numba.extending import intrinsic, overload

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
def _layer_output(acts, n, sizes, layer):
    """A^layer (layer >= 1): its (n, n_layer) rows in the flat block ``acts`` that
    :func:`_forward_all` fills with A^1, ..., A^L one after the other."""
    start = 0
    for i in range(1, layer):
        start += n * sizes[i]
    return acts[start : start + n * sizes[layer]].reshape((n, sizes[layer]))


@njit(cache=True)
def _layer_input(acts, X, sizes, layer):
    """A^layer, the input of layer ``layer`` + 1: X itself for layer 0 (read only)."""
    if layer == 0:
        return X
    return _layer_output(acts, X.shape[0], sizes, layer)


@njit(cache=True)
def _forward_all(params, sizes, act, X):
    """The block of [A^1, ..., A^L] (read with :func:`_layer_output`); hidden layers use
    ``act``, the output layer is linear. One allocation for all layers."""
    n_layers = len(sizes) - 1
    width = 0
    for layer in range(1, n_layers + 1):
        width += sizes[layer]
    acts = np.empty(X.shape[0] * width, dtype=X.dtype)
    for layer in range(n_layers):
        W, b = _layer_view(params, sizes, layer)
        A_prev = _layer_input(acts, X, sizes, layer)
        out = _layer_output(acts, X.shape[0], sizes, layer + 1)
        layer_forward(W, b, A_prev, act if layer < n_layers - 1 else 0, out)
    return acts


@njit(cache=True)
def _backward_all(params, grad, sizes, act, X, acts, G):
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
        A_prev = _layer_input(acts, X, sizes, layer)
        A = _layer_output(acts, X.shape[0], sizes, layer + 1)
        layer_backward(W, A_prev, A, G, act if layer < n_layers - 1 else 0, dW, db, G_prev)
        G = G_prev


@njit(cache=True)
def forward(params, sizes, act, X):
    """The network's output A^L (logits for softmax cross-entropy), in an array of its own."""
    acts = _forward_all(params, sizes, act, X)
    return _layer_output(acts, X.shape[0], sizes, len(sizes) - 1).copy()


# -- exp for the softmax: e^x = 2^k e^r, k = round(x / ln 2), |r| <= ln(2) / 2 ---------------
_LOG2E = np.float32(1.4426950408889634)
_LN2_HI, _LN2_LO = np.float32(0.693359375), np.float32(-2.12194440e-4)  # ln 2 = HI + LO
_EXP_MIN_ARG = np.float32(-87.33654)  # e^x is below float32's smallest normal number under it


@intrinsic
def _float32_from_bits(typingctx, bits):
    """The float32 whose IEEE-754 bit pattern is the int32 ``bits`` (a bit cast, no conversion)."""
    if bits != types.int32:
        return None

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float32))

    return types.float32(types.int32), codegen


def _exp_inplace(v):
    """In place v <- exp(v) for a 1-D float array ``v`` whose values are <= 0 or NaN.

    Plain Python (``NUMBA_DISABLE_JIT=1``) uses NumPy's exp, compiled float64 arrays libm's; the
    compiled float32 version (:func:`_exp_inplace_compiled`) is Cephes' ``expf``: with
    k = round(x log2 e) and r = x - k ln 2 (ln 2 split in two so r is exact),
    e^x = 2^k (1 + r + r^2/2 + ... + c_7 r^7), 2^k built from its exponent bits; relative
    error below 1.2e-7 (about 1 ulp); an x under -87.3365 gives e^-87.3365, about 2^-126
    (the smallest normal float32), instead of a subnormal or 0. Its loop has no call, so it
    vectorizes: 0.28 us for the 320 logits of bench (a) against 0.79 us for one libm
    ``expf`` call per logit (measured 2026-12-02).
    """
    np.exp(v, out=v)


@overload(_exp_inplace)
def _exp_inplace_compiled(v):
    """The compiled :func:`_exp_inplace`: Cephes' expf for float32, libm's exp otherwise."""
    if v.dtype != types.float32:
        def libm_exp(v):
            for i in range(v.size):
                v[i] = math.exp(v[i])
        return libm_exp

    def cephes_expf(v):
        for i in range(v.size):
            x = v[i]
            xc = x if x > _EXP_MIN_ARG else _EXP_MIN_ARG
            k = np.floor(xc * _LOG2E + np.float32(0.5))
            r = xc - k * _LN2_HI - k * _LN2_LO
            p = np.float32(1.9875691500e-4)
            p = p * r + np.float32(1.3981999507e-3)
            p = p * r + np.float32(8.3334519073e-3)
            p = p * r + np.float32(4.1665795894e-2)
            p = p * r + np.float32(1.6666665459e-1)
            p = p * r + np.float32(5.0000001201e-1)
            p = p * r * r + r + np.float32(1.0)
            scale = _float32_from_bits(np.int32((np.int32(k) + 127) << 23))
            v[i] = p * scale if x == x else x  # NaN stays NaN
    return cephes_expf


@njit(cache=True)
def _softmax_xent_delta(Z, y):
    """In place Z <- (softmax(Z) - onehot(y)) / n; returns the mean cross-entropy (float64).

    Per row: C_i = log sum_j e^(z_ij - max_j z_ij) - (z_iy - max_j z_ij); the exponentials of
    all rows in one vectorized pass (:func:`_exp_inplace`). Z is C-contiguous (A^L's block).
    """
    n, m = Z.shape
    total = 0.0
    for i in range(n):
        zmax = Z[i, 0]
        for j in range(1, m):
            zmax = max(zmax, Z[i, j])
        total -= Z[i, y[i]] - zmax
        for j in range(m):
            Z[i, j] -= zmax
    _exp_inplace(Z.reshape(-1))
    for i in range(n):
        s = 0.0
        for j in range(m):
            s += Z[i, j]
        total += math.log(s)
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
    logits = _layer_output(acts, X.shape[0], sizes, len(sizes) - 1)
    loss = _softmax_xent_delta(logits, y)
    _backward_all(params, grad, sizes, act, X, acts, logits)
    return loss


@njit(cache=True)
def loss_and_grad_mse(params, grad, sizes, act, X, T):
    """Mean (1/2) squared error against targets ``T``; writes dC/dparams into ``grad``."""
    acts = _forward_all(params, sizes, act, X)
    outputs = _layer_output(acts, X.shape[0], sizes, len(sizes) - 1)
    loss = _mse_delta(outputs, T)
    _backward_all(params, grad, sizes, act, X, acts, outputs)
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
