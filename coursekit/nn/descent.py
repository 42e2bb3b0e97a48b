"""Why a gradient step lowers the loss, and when it stops doing so.

A step w' = w - r g with g = grad L(w) changes the loss by (Taylor, first order)

    dL = L(w') - L(w) ~ g . (w' - w) = -r ||g||^2  <= 0,

so a small enough step always descends. The next term is (r^2 / 2) g^T H g (H the
Hessian): the relative error of the first-order prediction grows like r, and once
r g^T H g / 2 exceeds ||g||^2 the step overshoots and the loss rises. :func:`gd_steps`
measures predicted against actual dL step by step; :func:`lr_sweep` takes one step of
each learning rate from the same weights and finds the first rate whose loss rises.
Both use the full batch (plain gradient descent) on a :class:`~coursekit.nn.chain_rule.TwoLayerNet`,
in float64.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coursekit import checks
from coursekit.nn import chain_rule

__all__ = ["DescentSteps", "LrSweep", "gd_steps", "lr_sweep", "step"]

_PARAMS = ("W1", "b1", "W2", "b2")


def step(net: chain_rule.TwoLayerNet, X, y, lr: float):
    """One gradient step: (new net, predicted dL = -lr ||g||^2, actual dL = L(w') - L(w))."""
    lr = checks.real(lr, "lr", above=0)
    grads = chain_rule.backward(net, X, y)
    norm2 = sum(float(np.sum(grads[p] ** 2)) for p in _PARAMS)
    new = chain_rule.TwoLayerNet(**{p: getattr(net, p) - lr * grads[p] for p in _PARAMS},
                                 activation=net.activation, loss=net.loss)
    before, after = chain_rule.forward(net, X, y)["loss"], chain_rule.forward(new, X, y)["loss"]
    return new, -lr * norm2, after - before


@dataclass(frozen=True)
class DescentSteps:
    """Gradient descent at one rate: per step the loss before it, predicted and actual dL."""

    lr: float
    loss: np.ndarray
    predicted: np.ndarray
    actual: np.ndarray

    @property
    def rel_error(self) -> np.ndarray:
        """|actual - predicted| / |predicted| per step."""
        return np.abs(self.actual - self.predicted) / np.abs(self.predicted)


def gd_steps(net, X, y, lr: float, steps: int) -> DescentSteps:
    """``steps`` full-batch gradient steps at rate ``lr`` from ``net``."""
    steps = checks.integer(steps, "steps", at_least=1)
    losses, predicted, actual = [], [], []
    for _ in range(steps):
        losses.append(chain_rule.forward(net, X, y)["loss"])
        net, p, a = step(net, X, y, lr)
        predicted.append(p)
        actual.append(a)
    return DescentSteps(float(lr), np.array(losses), np.array(predicted), np.array(actual))


@dataclass(frozen=True)
class LrSweep:
    """One step of each rate in ``lrs`` (ascending) from the same weights."""

    lrs: np.ndarray
    predicted: np.ndarray
    actual: np.ndarray

    @property
    def first_rise(self) -> float | None:
        """The smallest rate whose step raised the loss (actual dL > 0), or None."""
        rising = np.flatnonzero(self.actual > 0)
        return float(self.lrs[rising[0]]) if len(rising) else None


def lr_sweep(net, X, y, lrs) -> LrSweep:
    """Predicted (-r ||g||^2) and actual dL of one step of each rate, from ``net``."""
    lrs = np.asarray(lrs, dtype=np.float64)
    if lrs.ndim != 1 or not len(lrs) or not np.all(lrs > 0) or not np.all(np.diff(lrs) > 0):
        raise ValueError(f"lrs must be positive learning rates in ascending order; got {lrs!r:.80}")
    results = [step(net, X, y, lr)[1:] for lr in lrs]
    return LrSweep(lrs, np.array([p for p, _ in results]), np.array([a for _, a in results]))
