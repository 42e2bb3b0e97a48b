"""Backpropagation derived with the chain, product and sum rules, on a two-layer network.

The network, one sample per row (n rows), as in :mod:`coursekit.nn.reference`::

    z1 = X W1 + b1      a1 = sigma(z1)      z2 = a1 W2 + b2      L = C(z2, y)

The three rules of the lecture, for scalars:

* chain rule:   if L depends on u only through v(u), then dL/du = dL/dv * dv/du;
* product rule: d(u v) = v du + u dv, so for one term z = a w: dz/dw = a and dz/da = w;
* sum rule:     d(u + v) = du + dv: a quantity used in several places collects one term
  from each place (a weight is used by every row, an activation by every output).

Applied from the loss back to the inputs, they give every intermediate:

* dL/dz2 = (softmax(z2) - onehot(y)) / n for softmax + cross-entropy, or (z2 - T) / n for
  the quadratic cost C = (1/2n) sum ||z2 - T||^2 (the mean over the batch puts the 1/n here);
* dL/dW2 = a1^T dL/dz2: z2[i,k] = sum_j a1[i,j] W2[j,k] + b2[k]; the product rule gives
  dz2[i,k]/dW2[j,k] = a1[i,j]; the sum rule adds the terms of every row i;
* dL/db2 = dL/dz2 summed over the rows (dz2[i,k]/db2[k] = 1 in every row: sum rule);
* dL/da1 = dL/dz2 W2^T: a1[i,j] feeds every output k with factor W2[j,k] (product rule),
  and the sum rule adds the k terms;
* dL/dz1 = dL/da1 * sigma'(z1), elementwise (chain rule through a1 = sigma(z1)), with
  sigma' written with the output a1 (:mod:`coursekit.nn.activations`);
* dL/dW1 = X^T dL/dz1 and dL/db1 = dL/dz1 summed over the rows, as for layer 2.

:func:`numeric_gradient` checks each of them on its own: it perturbs one entry of that
intermediate, recomputes the loss from there on (:func:`loss_from`), and takes central
differences (L(u + eps) - L(u - eps)) / (2 eps), accurate to O(eps^2) in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coursekit import checks
from coursekit.nn import activations, reference

__all__ = ["INTERMEDIATES", "TwoLayerNet", "backward", "forward", "loss_from", "numeric_gradient"]

#: the intermediates backpropagation computes, in the order it computes them
INTERMEDIATES = ("z2", "W2", "b2", "a1", "z1", "W1", "b1")
LOSSES = ("softmax_xent", "mse")


@dataclass(frozen=True)
class TwoLayerNet:
    """Weights of ``n_in -> n_hidden -> n_out`` (W of shape (n_in, n_out), as in the code) and
    the hidden activation and the loss (the output layer is linear)."""

    W1: np.ndarray
    b1: np.ndarray
    W2: np.ndarray
    b2: np.ndarray
    activation: str = "tanh"
    loss: str = "softmax_xent"

    def __post_init__(self):
        activations.activation_code(self.activation, "activation", activations.HIDDEN_ACTIVATIONS)
        if self.loss not in LOSSES:
            raise ValueError(f"loss={self.loss!r} is not supported; allowed: {', '.join(LOSSES)}")
        for name in ("W1", "b1", "W2", "b2"):
            if not isinstance(getattr(self, name), np.ndarray):
                raise TypeError(f"{name} must be a NumPy array; got {type(getattr(self, name)).__name__}")
        (n_in, n_hidden), (n_h2, n_out) = self.W1.shape, self.W2.shape
        if n_h2 != n_hidden or self.b1.shape != (n_hidden,) or self.b2.shape != (n_out,):
            raise ValueError(f"shapes do not chain: W1 {self.W1.shape}, b1 {self.b1.shape}, W2 {self.W2.shape}, "
                             f"b2 {self.b2.shape}; need W1 (n_in, h), b1 (h,), W2 (h, n_out), b2 (n_out,)")

    @classmethod
    def random(cls, n_in: int, n_hidden: int, n_out: int, *, activation: str = "tanh",
               loss: str = "softmax_xent", seed=0) -> "TwoLayerNet":
        """float64 weights N(0, 1/n_in) and biases N(0, 0.1^2) (non-zero, so db is tested too)."""
        sizes = [checks.integer(v, name, at_least=1)
                 for v, name in ((n_in, "n_in"), (n_hidden, "n_hidden"), (n_out, "n_out"))]
        rng = checks.rng(seed)
        W1 = rng.standard_normal((sizes[0], sizes[1])) / np.sqrt(sizes[0])
        W2 = rng.standard_normal((sizes[1], sizes[2])) / np.sqrt(sizes[1])
        return cls(W1, 0.1 * rng.standard_normal(sizes[1]), W2, 0.1 * rng.standard_normal(sizes[2]),
                   activation, loss)

    @property
    def params(self) -> dict[str, np.ndarray]:
        return {"W1": self.W1, "b1": self.b1, "W2": self.W2, "b2": self.b2}


def _loss(net: TwoLayerNet, z2, y):
    return reference.softmax_xent(z2, y) if net.loss == "softmax_xent" else reference.mse(z2, y)


def forward(net: TwoLayerNet, X, y) -> dict:
    """{"z1", "a1", "z2", "loss"} for the batch (X, y); y holds labels or (n, n_out) targets."""
    z1 = X @ net.W1 + net.b1
    a1 = activations.apply(z1, net.activation)
    z2 = a1 @ net.W2 + net.b2
    return {"z1": z1, "a1": a1, "z2": z2, "loss": _loss(net, z2, y)[0]}


def backward(net: TwoLayerNet, X, y) -> dict:
    """dL/du for every u of :data:`INTERMEDIATES`, by the rules of the module docstring."""
    f = forward(net, X, y)
    g = {"z2": _loss(net, f["z2"], y)[1]}                                # dL/dz2
    g["W2"] = f["a1"].T @ g["z2"]                                        # product + sum rules
    g["b2"] = g["z2"].sum(axis=0)                                        # sum rule
    g["a1"] = g["z2"] @ net.W2.T                                         # product + sum rules
    g["z1"] = g["a1"] * activations.derivative(f["a1"], net.activation)  # chain rule
    g["W1"] = X.T @ g["z1"]
    g["b1"] = g["z1"].sum(axis=0)
    return g


def loss_from(net: TwoLayerNet, X, y, name: str, value) -> float:
    """The loss with intermediate ``name`` set to ``value``, recomputed from there on."""
    if name not in INTERMEDIATES:
        raise ValueError(f"name={name!r} is not an intermediate; allowed: {', '.join(INTERMEDIATES)}")
    if name in net.params:
        params = net.params | {name: value}
        return forward(TwoLayerNet(**params, activation=net.activation, loss=net.loss), X, y)["loss"]
    z1 = value if name == "z1" else X @ net.W1 + net.b1
    a1 = value if name == "a1" else activations.apply(z1, net.activation)
    z2 = value if name == "z2" else a1 @ net.W2 + net.b2
    return _loss(net, z2, y)[0]


def numeric_gradient(net: TwoLayerNet, X, y, name: str, eps: float = 1e-6) -> np.ndarray:
    """Central differences of the loss with respect to every entry of intermediate ``name``."""
    checks.real(eps, "eps", above=0)
    if name not in INTERMEDIATES:
        raise ValueError(f"name={name!r} is not an intermediate; allowed: {', '.join(INTERMEDIATES)}")
    base = net.params[name] if name in net.params else forward(net, X, y)[name]
    base = np.array(base, dtype=np.float64)
    grad = np.empty_like(base)
    for i in np.ndindex(base.shape):
        u = base.copy()
        u[i] += eps
        plus = loss_from(net, X, y, name, u)
        u[i] -= 2 * eps
        grad[i] = (plus - loss_from(net, X, y, name, u)) / (2 * eps)
    return grad
