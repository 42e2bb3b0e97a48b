"""Chapter 1 check: the student's backward pass of one layer.

The student writes ``layer_backward(W, a_prev, a, grad_a, activation)`` returning
``(dW, db, grad_a_prev)`` (see :func:`coursekit.nn.reference.layer_backward`):

    delta = grad_a * sigma'(z)        sigma' written with a = sigma(z)
    dW = a_prev^T delta,   db = sum of delta over the rows,   grad_a_prev = delta W^T

with W of shape (n_in, n_out) (a layer computes a = sigma(a_prev W + b), one sample per row).

The check compares it with the reference on random shapes and every activation, then
chains it through a whole network and compares the flat gradient with
:func:`coursekit.nn.reference.loss_and_grad`.
"""

from __future__ import annotations

import numpy as np

from coursekit.grading.core import CheckFailure, check
from coursekit.nn import activations, layout, reference

__all__ = ["check_layer_backward"]

_HINTS = (
    ("dW", "dC/dW = a_prev^T delta, with delta = grad_a * sigma'(z)"),
    ("db", "dC/db = delta summed over the batch (axis 0)"),
    ("grad_a_prev", "dC/da_prev = delta W^T"),
)


def _compare(got, want, case: str) -> None:
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        raise CheckFailure(f"for {case}: expected a tuple (dW, db, grad_a_prev), got {type(got).__name__}")
    for (name, hint), g, w in zip(_HINTS, got, want):
        g = np.asarray(g)
        if g.shape != w.shape:
            raise CheckFailure(f"for {case}: {name} has shape {g.shape}, expected {w.shape} ({hint})")
        if not np.allclose(g, w, rtol=1e-6, atol=1e-9):
            err = np.max(np.abs(g - w))
            raise CheckFailure(f"for {case}: {name} differs from the reference by up to {err:.3g} ({hint})")


def _layer_cases(rng):
    for activation in activations.ACTIVATIONS:
        for _ in range(2):
            n, n_in, n_out = (int(v) for v in rng.integers(1, 7, size=3))
            W = rng.standard_normal((n_in, n_out))
            b = rng.standard_normal(n_out)
            a_prev = rng.standard_normal((n, n_in))
            a = activations.apply(a_prev @ W + b, activation)
            grad_a = rng.standard_normal((n, n_out))
            case = f"activation={activation!r}, W of shape {W.shape}, a batch of {n}"
            yield case, (W, a_prev, a, grad_a, activation)


@check("layer_backward")
def check_layer_backward(layer_backward, seed: int = 0):
    """Compare ``layer_backward`` with the reference on random layers, then on a network."""
    rng = np.random.default_rng(seed)
    count = 0
    for case, args in _layer_cases(rng):
        want = reference.layer_backward(*args)
        copies = [x.copy() if isinstance(x, np.ndarray) else x for x in args]
        got = layer_backward(*copies)
        for name, original, passed in zip(("W", "a_prev", "a", "grad_a"), args, copies):
            if not np.array_equal(original, passed):
                raise CheckFailure(
                    f"for {case}: your function changed its input {name} in place; "
                    "compute into new arrays (the caller still needs its inputs)"
                )
        _compare(got, want, case)
        count += 1

    sizes, activation = (5, 4, 6, 3), "tanh"
    params = rng.standard_normal(layout.n_params(sizes))
    X, y = rng.standard_normal((4, sizes[0])), rng.integers(0, sizes[-1], 4)
    _, want = reference.loss_and_grad(params, sizes, activation, "softmax_xent", X, y)
    acts = reference.forward(params, sizes, activation, X)
    _, grad_a = reference.softmax_xent(acts[-1], y)
    got = np.empty_like(params)
    views = layout.views(params, sizes)
    for i, (dW, db) in reversed(list(enumerate(layout.views(got, sizes)))):
        act = activation if i < len(views) - 1 else "identity"
        dW[...], db[...], grad_a = layer_backward(views[i][0], acts[i], acts[i + 1], grad_a, act)
    if not np.allclose(got, want, rtol=1e-6, atol=1e-9):
        raise CheckFailure(
            f"every layer matched alone, but chained through a {'-'.join(map(str, sizes))} "
            f"network the flat gradient differs by up to {np.max(np.abs(got - want)):.3g}"
        )
    return f"{count} random layers (all activations) and a {len(sizes) - 1}-layer network match the reference"
