"""Backpropagation in plain NumPy: the readable reference for the lecture and the tests.

Rows are samples: a mini-batch of n inputs is an (n, n_0) array. The lecture's column
form z^l = W^l a^{l-1} + b^l, written for all n rows at once, is Z^l = A^{l-1} W + b^l
with W = (W^l)^T of shape (n_{l-1}, n_l) (see :mod:`coursekit.nn.layout`).

Forward, layer l:            A^l = sigma(A^{l-1} W + b)
Output error (loss C):       delta^L = dC/dZ^L
Backward, layer l, given the upstream gradient G^l = dC/dA^l:
    delta^l      = G^l * sigma'(Z^l)                 (elementwise)
    dC/dW        = (A^{l-1})^T delta^l               (sum over the batch of a delta^T)
    dC/db        = sum over rows of delta^l
    G^{l-1}      = delta^l W^T                       (the lecture's (W^{l+1})^T delta^{l+1})

Losses are means over the batch, so the 1/n of the lecture's update rule
w <- w - (eta/m) sum_x delta^{x,l} (a^{x,l-1})^T sits inside delta^L.
"""

from __future__ import annotations

import numpy as np

from coursekit.nn import activations, layout

__all__ = [
    "forward",
    "layer_backward",
    "layer_forward",
    "loss_and_grad",
    "mse",
    "one_hot",
    "softmax_xent",
]


def layer_forward(W, b, a_prev, activation: str) -> np.ndarray:
    """A^l = sigma(A^{l-1} W + b)."""
    return activations.apply(a_prev @ W + b, activation)


def layer_backward(W, a_prev, a, grad_a, activation: str):
    """One layer's backward pass given G = dC/dA^l; returns (dW, db, dC/dA^{l-1})."""
    delta = grad_a * activations.derivative(a, activation)
    return a_prev.T @ delta, delta.sum(axis=0), delta @ W.T


def one_hot(y, n_classes: int, dtype=np.float64) -> np.ndarray:
    """T[i, y_i] = 1, zeros elsewhere."""
    t = np.zeros((len(y), n_classes), dtype=dtype)
    t[np.arange(len(y)), y] = 1
    return t


def softmax_xent(z, y):
    """C = -(1/n) sum_i log softmax(z_i)[y_i]; returns (C, delta^L = (softmax(z) - onehot(y)) / n)."""
    n = len(z)
    shifted = z - z.max(axis=1, keepdims=True)  # exp never overflows
    log_p = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    loss = -log_p[np.arange(n), y].mean()
    return float(loss), (np.exp(log_p) - one_hot(y, z.shape[1], z.dtype)) / n


def mse(out, t):
    """C = (1/(2n)) sum_i ||out_i - t_i||^2 (the lecture's 1/2 ||y - a^L||^2, averaged); delta = (out - t)/n."""
    n = len(out)
    diff = out - t
    return float(0.5 * np.sum(diff * diff) / n), diff / n


def forward(params, sizes, activation: str, X) -> list[np.ndarray]:
    """All activations [A^0 = X, A^1, ..., A^L]; the output layer is linear ("identity")."""
    acts = [X]
    ws = layout.views(params, sizes)
    for i, (W, b) in enumerate(ws):
        acts.append(layer_forward(W, b, acts[-1], activation if i < len(ws) - 1 else "identity"))
    return acts


def loss_and_grad(params, sizes, activation: str, loss: str, X, y):
    """(C, flat dC/dparams) for a mini-batch; ``y`` holds labels ("softmax_xent") or targets ("mse")."""
    acts = forward(params, sizes, activation, X)
    if loss == "softmax_xent":
        value, grad_a = softmax_xent(acts[-1], y)
    elif loss == "mse":
        value, grad_a = mse(acts[-1], y)
    else:
        raise ValueError(f"loss={loss!r} is not supported; allowed: softmax_xent, mse")
    grad = np.empty_like(params)
    grads = layout.views(grad, sizes)
    ws = layout.views(params, sizes)
    for i in reversed(range(len(ws))):
        act = activation if i < len(ws) - 1 else "identity"
        dW, db, grad_a = layer_backward(ws[i][0], acts[i], acts[i + 1], grad_a, act)
        grads[i][0][...] = dW
        grads[i][1][...] = db
    return value, grad
