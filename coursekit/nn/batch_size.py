"""Full-batch gradient descent, SGD and mini-batch SGD: the same loop at different batch sizes.

With n training rows and batch size b, one epoch (one pass over the data, shuffled) makes

    S = ceil(n / b) updates w <- w - r grad L(D_i, w)        (the lecture's S = D / B)

so b = n is plain gradient descent (one update per epoch, each one a whole pass over the
data), b = 1 is stochastic gradient descent (n noisy updates), and 1 < b < n mini-batch SGD.
The forward pass keeps every layer's activations for the backward pass: for widths
n_0, ..., n_L that is

    b * (n_0 + n_1 + ... + n_L) * itemsize   bytes per step,

so memory grows with b while the number of updates per epoch falls as 1/b.

The learning rate of each batch size follows one of chapter 3's rules, from ``base_lr`` at
``base_batch``: "constant" (r), "sqrt" (r sqrt(b / b0)) or "linear" (r b / b0).
:func:`compare_batch_sizes` trains the same initial network at each batch size for the same
number of epochs and returns, per batch size, the full training loss after every epoch,
the wall time, the updates and the activation bytes counted on a real forward pass.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from coursekit import checks
from coursekit.data import Dataset
from coursekit.nn import activations, reference
from coursekit.nn.mlp import MLP
from coursekit.nn.speed import single_thread
from coursekit.nn.train import train

__all__ = ["BatchConfig", "BatchRun", "activation_bytes", "compare_batch_sizes", "updates_per_epoch"]

LR_RULES = ("constant", "sqrt", "linear")


@dataclass(frozen=True)
class BatchConfig:
    """What to compare: batch sizes (b = n of the training set is full-batch GD), epochs,
    the learning-rate rule, and the 64-``hidden``-10 network (float64 unless said), trained on one BLAS thread."""

    batch_sizes: tuple = (1, 32, 1347)
    epochs: int = 10
    base_lr: float = 0.1
    base_batch: int = 32
    lr_rule: str = "sqrt"
    hidden: int = 32
    activation: str = "relu"
    seed: int = 0
    dtype: type = np.float64

    def __post_init__(self):
        if not isinstance(self.batch_sizes, tuple) or not self.batch_sizes:
            raise TypeError(f"batch_sizes must be a non-empty tuple of integers; got {self.batch_sizes!r}")
        for b in self.batch_sizes:
            checks.integer(b, "batch_sizes", at_least=1, hint=" (each a positive integer)")
        checks.integer(self.epochs, "epochs", at_least=1)
        checks.real(self.base_lr, "base_lr", above=0)
        checks.integer(self.base_batch, "base_batch", at_least=1)
        if self.lr_rule not in LR_RULES:
            raise ValueError(f"lr_rule={self.lr_rule!r} is not supported; allowed: {', '.join(LR_RULES)}")
        checks.integer(self.hidden, "hidden", at_least=1)
        activations.activation_code(self.activation, "activation", activations.HIDDEN_ACTIVATIONS)
        checks.integer(self.seed, "seed", at_least=0)
        checks.float_dtype(self.dtype)

    def lr(self, batch_size: int) -> float:
        """The rule's learning rate for ``batch_size``."""
        power = {"constant": 0.0, "sqrt": 0.5, "linear": 1.0}[self.lr_rule]
        return self.base_lr * (batch_size / self.base_batch) ** power


@dataclass(frozen=True)
class BatchRun:
    """One batch size: per epoch the full training loss and the wall time so far."""

    batch_size: int
    lr: float
    updates_per_epoch: int  # counted: steps taken / epochs
    loss: np.ndarray  # full training loss after each epoch
    seconds: np.ndarray  # wall time at the end of each epoch (with train's accuracy pass, without the loss pass)
    activation_bytes: int  # counted on a forward pass of one batch
    train_accuracy: float
    test_accuracy: float

    @property
    def gap(self) -> float:
        """Generalization gap: training accuracy minus test accuracy."""
        return self.train_accuracy - self.test_accuracy


def activation_bytes(model: MLP, X) -> int:
    """Bytes of the activations A^0 = X, A^1, ..., A^L a forward pass of the batch ``X`` keeps
    for the backward pass, counted on the arrays :func:`coursekit.nn.reference.forward` makes."""
    X = model.check_inputs(X)
    acts = reference.forward(model.params, model.sizes, model.activation, X)
    return sum(a.nbytes for a in acts)


def compare_batch_sizes(config: BatchConfig, data: Dataset) -> list[BatchRun]:
    """Train the same initial network at every batch size of ``config``; one run each."""
    checks.instance(config, "config", BatchConfig)
    checks.instance(data, "data", Dataset)
    n = len(data.X_train)
    if max(config.batch_sizes) > n:
        raise ValueError(f"batch_sizes={config.batch_sizes}: at most the {n} training rows")
    X, y = data.X_train.astype(config.dtype), data.y_train
    X_test = data.X_test.astype(config.dtype)
    runs = []
    with single_thread():  # one BLAS thread: a busy machine's thread pool would swamp the small products
        for b in config.batch_sizes:
            init_seed, shuffle_seed = np.random.SeedSequence(config.seed).spawn(2)
            model = MLP([data.n_features, config.hidden, data.n_classes], config.activation, dtype=config.dtype,
                        seed=np.random.default_rng(init_seed))
            losses, seconds, evaluating = [], [], [0.0]

            def record(history, model=model, losses=losses, seconds=seconds, evaluating=evaluating):
                start = time.perf_counter()
                losses.append(model.loss_and_grad(X, y, validate=False)[0])
                seconds.append(history.seconds - evaluating[0])
                evaluating[0] += time.perf_counter() - start

            history = train(model, X, y, epochs=config.epochs, batch_size=b, lr=config.lr(b),
                            seed=np.random.default_rng(shuffle_seed), callback=record)
            runs.append(BatchRun(b, config.lr(b), len(history.step_loss) // config.epochs, np.array(losses),
                                 np.array(seconds), activation_bytes(model, X[:b]),
                                 model.accuracy(X, y), model.accuracy(X_test, data.y_test)))
    return runs


def updates_per_epoch(n: int, batch_size: int) -> int:
    """S = ceil(n / b): the updates of one epoch over n rows."""
    return math.ceil(checks.integer(n, "n", at_least=1) / checks.integer(batch_size, "batch_size", at_least=1))
