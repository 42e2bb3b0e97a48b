"""Train / validation / test: choose a setting on validation data, report the test set once.

The lecture's workflow: split the labelled data into a training set (fit the weights), a
validation set (compare settings: here the hidden width) and a test set (touched once, at
the end, so its accuracy estimates the accuracy on new data). Choosing on the test set
would make its accuracy an optimistic estimate, since the choice was fitted to it.

:func:`validation_curve` holds ``val_fraction`` of the training rows out
(:func:`coursekit.data.validation_split`), trains one network per width on the rest with
the same seed, picks the width of the highest validation accuracy (the first, i.e.
smallest, among ties), and evaluates only that network on the test set.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coursekit import checks
from coursekit.data import Dataset, validation_split
from coursekit.nn import activations
from coursekit.nn.mlp import MLP
from coursekit.nn.speed import single_thread
from coursekit.nn.train import train

__all__ = ["ValidationConfig", "ValidationCurve", "validation_curve"]


@dataclass(frozen=True)
class ValidationConfig:
    """The hidden widths to compare and how each network is trained (float64, one BLAS thread)."""

    widths: tuple = (1, 2, 4, 8, 16, 32, 64)
    val_fraction: float = 0.2
    epochs: int = 10
    batch_size: int = 32
    lr: float = 0.1
    activation: str = "relu"
    seed: int = 0

    def __post_init__(self):
        if not isinstance(self.widths, tuple) or not self.widths:
            raise TypeError(f"widths must be a non-empty tuple of integers; got {self.widths!r}")
        for w in self.widths:
            checks.integer(w, "widths", at_least=1, hint=" (each a positive integer)")
        checks.real(self.val_fraction, "val_fraction", above=0, below=1)
        checks.integer(self.epochs, "epochs", at_least=1)
        checks.integer(self.batch_size, "batch_size", at_least=1)
        checks.real(self.lr, "lr", above=0)
        activations.activation_code(self.activation, "activation", activations.HIDDEN_ACTIVATIONS)
        checks.integer(self.seed, "seed", at_least=0)


@dataclass(frozen=True)
class ValidationCurve:
    """Training and validation accuracy per width, the chosen width and its test accuracy."""

    config: ValidationConfig
    n_fit: int
    n_val: int
    train_accuracy: np.ndarray
    val_accuracy: np.ndarray
    chosen: int  # the width picked on validation
    test_accuracy: float  # of the chosen network only


def validation_curve(config: ValidationConfig, data: Dataset) -> ValidationCurve:
    """One network per width, fitted without the validation rows; the test set is used once."""
    checks.instance(config, "config", ValidationConfig)
    checks.instance(data, "data", Dataset)
    X_fit, y_fit, X_val, y_val = validation_split(data.X_train.astype(np.float64), data.y_train,
                                                  config.val_fraction, seed=config.seed)
    models, fit_acc, val_acc = [], [], []
    with single_thread():
        for width in config.widths:
            init_seed, shuffle_seed = np.random.SeedSequence(config.seed).spawn(2)
            model = MLP([data.n_features, width, data.n_classes], config.activation, dtype=np.float64,
                        seed=np.random.default_rng(init_seed))
            train(model, X_fit, y_fit, epochs=config.epochs, batch_size=config.batch_size, lr=config.lr,
                  seed=np.random.default_rng(shuffle_seed))
            models.append(model)
            fit_acc.append(model.accuracy(X_fit, y_fit))
            val_acc.append(model.accuracy(X_val, y_val))
    best = int(np.argmax(val_acc))  # the first maximum: the smallest of equally good widths
    test = models[best].accuracy(data.X_test.astype(np.float64), data.y_test)
    return ValidationCurve(config, len(X_fit), len(X_val), np.array(fit_acc), np.array(val_acc),
                           config.widths[best], test)
