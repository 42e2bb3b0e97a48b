"""The chapter-1 experiment as a pure function: train an MLP on the digits, return the curves.

The widget panel (:mod:`coursekit.widgets.backprop`) only wires its sliders to
:func:`train_digits` and draws the result; the notebook and the tests call it directly.
Its defaults are the course's default digits settings (>= 95 % test accuracy, tested).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coursekit import checks
from coursekit.data import Dataset, load_digits
from coursekit.nn.mlp import MLP
from coursekit.nn.train import History, train

__all__ = ["DigitsResult", "train_digits"]


@dataclass(frozen=True)
class DigitsResult:
    """The settings of a run, its history and final test accuracy."""

    hidden: int
    lr: float
    batch_size: int
    activation: str
    epochs: int
    seed: int
    history: History

    @property
    def test_accuracy(self) -> float:
        return float(self.history.test_accuracy[-1])


def train_digits(
    hidden: int = 64,
    lr: float = 0.1,
    batch_size: int = 32,
    activation: str = "relu",
    epochs: int = 20,
    seed: int = 0,
    *,
    data: Dataset | None = None,
    callback=None,
) -> DigitsResult:
    """Train a 64-``hidden``-10 MLP with SGD on the digits (``data``, default :func:`load_digits`)."""
    checks.callback(callback, "callback", "(history)")
    data = load_digits() if data is None else checks.instance(
        data, "data", Dataset, " (e.g. coursekit.data.load_digits()) or None")
    init_seed, shuffle_seed = np.random.SeedSequence(seed).spawn(2)  # independent streams
    model = MLP([data.n_features, hidden, data.n_classes], activation, seed=np.random.default_rng(init_seed))
    history = train(
        model,
        data.X_train,
        data.y_train,
        epochs=epochs,
        batch_size=batch_size,
        lr=lr,
        seed=np.random.default_rng(shuffle_seed),
        X_test=data.X_test,
        y_test=data.y_test,
        callback=callback,
    )
    return DigitsResult(hidden, lr, batch_size, activation, epochs, seed, history)
