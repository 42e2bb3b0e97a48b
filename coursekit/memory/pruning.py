"""Pruning's size cut: magnitude pruning and the bytes of the pruned model stored sparse.

Magnitude pruning keeps the ``k`` weights of largest ``|w|`` over every layer's ``W`` (one
global threshold) and sets the others to zero; biases are kept. A pruned model saves
memory only if it is stored sparse. In CSR, layer ``l`` (``W_l`` of ``n_l x n_{l+1}``,
``k_l`` kept) takes ``k_l`` values, ``k_l`` column indices and ``n_l + 1`` row pointers, so
the whole model takes

    bytes = itemsize * (k + sum_l n_{l+1}) + index_bytes * (k + sum_l (n_l + 1))

(values and the dense biases at ``itemsize``, indices and pointers at ``index_bytes``)
(:func:`sparse_bytes`), and the most weights that fit ``budget`` bytes is
``k = floor((budget - itemsize sum_l n_{l+1} - index_bytes sum_l (n_l + 1)) /
(itemsize + index_bytes))`` (:func:`keep_to_fit`).
"""

from __future__ import annotations

import numpy as np

from coursekit import checks
from coursekit.nn import layout

__all__ = ["keep_to_fit", "magnitude_prune", "sparse_bytes"]


def _fixed(sizes, itemsize: int, index_bytes: int) -> int:
    return itemsize * sum(sizes[1:]) + index_bytes * sum(n + 1 for n in sizes[:-1])


def _check(sizes, itemsize, index_bytes):
    sizes = layout.check_sizes(sizes)
    checks.integer(itemsize, "itemsize", at_least=1, hint=" (bytes per value)")
    checks.integer(index_bytes, "index_bytes", at_least=1, hint=" (bytes per index)")
    return sizes


def sparse_bytes(sizes, kept: int, *, itemsize: int = 8, index_bytes: int = 4) -> int:
    """Bytes of the MLP ``sizes`` with ``kept`` weights stored in CSR (module docstring)."""
    sizes = _check(sizes, itemsize, index_bytes)
    n_weights = sum(a * b for a, b in zip(sizes[:-1], sizes[1:]))
    checks.integer(kept, "kept", at_least=0, at_most=n_weights, hint=" (weights kept)")
    return (itemsize + index_bytes) * kept + _fixed(sizes, itemsize, index_bytes)


def keep_to_fit(sizes, budget_bytes: int, *, itemsize: int = 8, index_bytes: int = 4) -> int:
    """The most weights the pruned MLP ``sizes`` may keep and fit ``budget_bytes`` stored
    sparse; ValueError if not even the biases and row pointers fit."""
    sizes = _check(sizes, itemsize, index_bytes)
    checks.integer(budget_bytes, "budget_bytes", at_least=1)
    room = budget_bytes - _fixed(sizes, itemsize, index_bytes)
    if room < 0:
        raise ValueError(f"budget_bytes={budget_bytes:,}: the biases and row pointers alone "
                         f"take {_fixed(sizes, itemsize, index_bytes):,} bytes")
    n_weights = sum(a * b for a, b in zip(sizes[:-1], sizes[1:]))
    return min(room // (itemsize + index_bytes), n_weights)


def magnitude_prune(mlp, kept: int):
    """A copy of ``mlp`` keeping the ``kept`` weights of largest magnitude (over every
    layer's W; ties at the threshold are broken by position), the other weights zero,
    the biases unchanged."""
    from coursekit.nn import MLP

    checks.instance(mlp, "mlp", MLP, " (coursekit.nn.MLP)")
    pruned = mlp.copy()
    weights = [layer.W for layer in pruned.layers]
    n_weights = sum(W.size for W in weights)
    checks.integer(kept, "kept", at_least=0, at_most=n_weights, hint=" (weights kept)")
    flat = np.concatenate([np.abs(W).ravel() for W in weights])
    keep = np.zeros(n_weights, bool)
    keep[np.argsort(-flat, kind="stable")[:kept]] = True
    start = 0
    for W in weights:
        W[~keep[start:start + W.size].reshape(W.shape)] = 0
        start += W.size
    return pruned
