"""Chapter 1 checks: the student's backward pass of one layer, and of a two-layer network.

The student writes ``layer_backward(W, a_prev, a, grad_a, activation)`` returning
``(dW, db, grad_a_prev)`` (see :func:`coursekit.nn.reference.layer_backward`):

    delta = grad_a * sigma'(z)        sigma' written with a = sigma(z)
    dW = a_prev^T delta,   db = sum of delta over the rows,   grad_a_prev = delta W^T

with W of shape (n_in, n_out) (a layer computes a = sigma(a_prev W + b), one sample per row).

The check compares it with the reference on random shapes and every activation, then
chains it through a whole network and compares the flat gradient with
:func:`coursekit.nn.reference.loss_and_grad`.

The second exercise derives backpropagation with the chain, product and sum rules: the
student writes ``two_layer_backward(W1, b1, W2, b2, X, T)`` for z1 = X W1 + b1,
a1 = sigmoid(z1), z2 = a1 W2 + b2 and the quadratic cost L = (1/2n) sum ||z2 - T||^2, returning
dL/du for every u of :data:`coursekit.nn.chain_rule.INTERMEDIATES`. The check compares
each one, in the order backpropagation computes them, with central differences of the loss
(:func:`coursekit.nn.chain_rule.numeric_gradient`), and the weight gradients with
:func:`coursekit.nn.reference.loss_and_grad`.
"""

from __future__ import annotations

import numpy as np

from coursekit.grading.core import CheckFailure, check
from coursekit.nn import activations, chain_rule, layout, reference

__all__ = ["check_layer_backward", "check_two_layer_backward"]

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


_RULES = {
    "z2": "dL/dz2 = (z2 - T) / n for L = (1/2n) sum ||z2 - T||^2",
    "W2": "product rule, then the sum rule over the rows: a1^T dL/dz2",
    "b2": "sum rule: dL/dz2 summed over the rows (axis 0)",
    "a1": "a1[i, j] feeds every output k with weight W2[j, k]: dL/dz2 W2^T",
    "z1": "chain rule through a1 = sigmoid(z1): dL/da1 * a1 (1 - a1)",
    "W1": "as for W2, one layer down: X^T dL/dz1",
    "b1": "dL/dz1 summed over the rows (axis 0)",
}


@check("two_layer_backward")
def check_two_layer_backward(two_layer_backward, seed: int = 0):
    """Every intermediate of ``two_layer_backward`` against central differences of the loss,
    and the weight gradients against the reference, on random networks and batches."""
    rng = np.random.default_rng(seed)
    for case in range(3):
        n, n_in, n_hidden, n_out = (int(v) for v in rng.integers(1, 6, size=4))
        net = chain_rule.TwoLayerNet.random(n_in, n_hidden, n_out, activation="sigmoid", loss="mse", seed=rng)
        X, T = rng.standard_normal((n, n_in)), rng.standard_normal((n, n_out))
        where = f"a {n_in}-{n_hidden}-{n_out} network on a batch of {n}"
        args = [net.W1, net.b1, net.W2, net.b2, X, T]
        copies = [a.copy() for a in args]
        got = two_layer_backward(*copies)
        for name, original, passed in zip(("W1", "b1", "W2", "b2", "X", "T"), args, copies):
            if not np.array_equal(original, passed):
                raise CheckFailure(f"for {where}: your function changed its input {name} in place")
        if not isinstance(got, dict):
            raise CheckFailure(f"for {where}: expected a dict {{'z2': ..., 'W2': ..., ...}}, got {type(got).__name__}")
        for name in chain_rule.INTERMEDIATES:
            if name not in got:
                raise CheckFailure(f"for {where}: the dict has no {name!r} (dL/d{name}: {_RULES[name]})")
            g = np.asarray(got[name])
            want = chain_rule.numeric_gradient(net, X, T, name)
            if g.shape != want.shape:
                raise CheckFailure(f"for {where}: dL/d{name} has shape {g.shape}, expected {want.shape} "
                                   f"({_RULES[name]})")
            err = float(np.max(np.abs(g - want)))
            if err > 1e-6 * max(1.0, float(np.max(np.abs(want)))):
                raise CheckFailure(f"for {where}: dL/d{name} differs from central differences by up to {err:.3g} "
                                   f"({_RULES[name]})")
        params = np.concatenate([net.W1.ravel(), net.b1, net.W2.ravel(), net.b2])
        _, flat = reference.loss_and_grad(params, (n_in, n_hidden, n_out), "sigmoid", "mse", X, T)
        mine = np.concatenate([np.ravel(got[k]) for k in ("W1", "b1", "W2", "b2")])
        if not np.allclose(mine, flat, rtol=1e-6, atol=1e-9):
            raise CheckFailure(f"for {where}: dL/dW1, db1, dW2, db2 differ from the reference's gradient "
                               f"by up to {np.max(np.abs(mine - flat)):.3g}")
    return "every intermediate of 3 random networks matches central differences and the reference"
