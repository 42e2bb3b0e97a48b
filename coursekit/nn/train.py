"""Mini-batch SGD training: the lecture's loop, with a history and an optional progress bar.

For every epoch: shuffle the training rows (a fresh permutation from a seeded
``np.random.Generator``), then for every mini-batch B compute
C_B and g = dC_B/dw (one flat buffer) and let the optimizer step: w <- w - lr * g.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from coursekit import checks
from coursekit.data import minibatches
from coursekit.nn.mlp import MLP
from coursekit.nn.optim import make_optimizer

__all__ = ["History", "train"]


@dataclass(frozen=True)
class History:
    """Per-epoch curves (index e is after epoch e + 1) and the loss of every step."""

    train_loss: np.ndarray  # mean mini-batch loss over the epoch
    train_accuracy: np.ndarray
    test_accuracy: np.ndarray  # NaN when no test set was given
    step_loss: np.ndarray
    seconds: float  # wall-clock time of the whole run (varies from run to run)

    @property
    def epochs(self) -> int:
        return len(self.train_loss)

    @property
    def diverged_at(self) -> int | None:
        """The first epoch (1-based) in which a step's loss was NaN or infinite, or None."""
        bad = np.flatnonzero(~np.isfinite(self.step_loss))
        if not len(bad):
            return None
        steps_per_epoch = len(self.step_loss) // self.epochs
        return int(bad[0]) // steps_per_epoch + 1


def train(
    model,
    X,
    y,
    *,
    epochs: int = 20,
    batch_size: int = 32,
    lr: float = 0.1,
    momentum: float = 0.0,
    optimizer=None,
    seed=0,
    X_test=None,
    y_test=None,
    progress: bool = False,
    callback=None,
) -> History:
    """Train ``model`` (an MLP) in place; return its :class:`History`.

    ``optimizer`` defaults to SGD(lr) (or Momentum when ``momentum > 0``) on ``model.params``.
    ``seed`` (int or Generator) drives the per-epoch shuffling. ``callback(history)`` runs
    after every epoch with the curves so far (for live plots). ``progress`` shows a tqdm bar.
    """
    checks.instance(model, "model", MLP, " (coursekit.nn.MLP)")
    epochs = checks.integer(epochs, "epochs", at_least=1)
    batch_size = checks.integer(batch_size, "batch_size", at_least=1)
    if optimizer is not None and not callable(getattr(optimizer, "step", None)):
        raise TypeError(f"optimizer must have a step(grad) method (e.g. coursekit.nn.SGD); "
                        f"got {optimizer!r:.60}")
    checks.callback(callback, "callback", "(history)")
    checks.boolean(progress, "progress")
    rng = checks.rng(seed)
    X, y = model.check_batch(X, y)  # once for the whole data set; batches skip the checks
    has_test = X_test is not None
    if has_test != (y_test is not None):
        raise ValueError("pass both X_test and y_test, or neither")
    if has_test:
        X_test = model.check_inputs(X_test)
    if optimizer is None:
        optimizer = make_optimizer(model.params, lr, momentum)
    labels = y if y.ndim == 1 else np.argmax(y, axis=1)
    grad = np.empty_like(model.params)
    step_loss, curves = [], {"train_loss": [], "train_accuracy": [], "test_accuracy": []}
    start = time.perf_counter()

    def history() -> History:
        return History(
            **{k: np.array(v) for k, v in curves.items()},
            step_loss=np.array(step_loss),
            seconds=time.perf_counter() - start,
        )

    from tqdm.auto import tqdm  # here, not at import: coursekit.nn must import without tqdm

    bar = tqdm(range(epochs), desc="epochs", disable=not progress)
    for _ in bar:
        first = len(step_loss)
        for Xb, yb in minibatches(X, y, batch_size, rng):
            loss, _ = model.loss_and_grad(Xb, yb, out=grad, validate=False)
            optimizer.step(grad)
            step_loss.append(loss)
        curves["train_loss"].append(float(np.mean(step_loss[first:])))
        curves["train_accuracy"].append(model.accuracy(X, labels))
        curves["test_accuracy"].append(model.accuracy(X_test, y_test) if has_test else np.nan)
        bar.set_postfix(loss=f"{curves['train_loss'][-1]:.4f}", test_acc=f"{curves['test_accuracy'][-1]:.3f}")
        if callback is not None:
            callback(history())
    return history()
