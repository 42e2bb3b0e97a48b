"""The mixed-precision experiments of the memory chapter, as pure functions returning numbers.

* :func:`underflow` - how many gradients a 16-bit backward turns into zeros, with and
  without loss scaling (fp16), and what bf16 does instead (no zeros, less precision).
* :func:`compare_formats` - train the digits MLP in fp32, fp16 + dynamic loss scaling,
  bf16, and fp16 without scaling; ``loss_weight`` makes every gradient small on purpose.
* :func:`overflow` - a dynamic scaler started too high halves and skips until the backward
  is finite: floor(log2(S_0 / S_limit)) + 1 skipped steps, S_limit = overflow / peak.

All run on :func:`coursekit.data.load_digits` with the 64-``hidden``-10 ReLU MLP of chapter 1.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from coursekit import checks
from coursekit.data import Dataset, load_digits
from coursekit.nn.mixed_precision import LossScaler, MixedHistory, MixedPrecision, train_mixed
from coursekit.nn.mlp import MLP
from coursekit.nn.precision import FORMATS
from coursekit.nn.train import train

__all__ = ["FormatsResult", "OverflowResult", "UnderflowResult", "compare_formats", "overflow",
           "underflow"]

#: the runs of :func:`compare_formats`: (label, format, dynamic loss scaling?)
RUNS = (("fp32", "fp32", False), ("fp16 + loss scaling", "fp16", True),
        ("bf16", "bf16", False), ("fp16, no scaling", "fp16", False))


def _digits(data) -> Dataset:
    """``data`` if it is a Dataset, the digits when None."""
    return load_digits() if data is None else checks.instance(
        data, "data", Dataset, " (e.g. coursekit.data.load_digits()) or None")


def _digits_mlp(data: Dataset, hidden: int, seed, activation: str = "relu") -> MLP:
    return MLP([data.n_features, hidden, data.n_classes], activation, seed=seed)


def _limit_scale(model: MLP, X, y) -> tuple[float, float]:
    """(peak, S_limit): the largest |value| the fp16 backward rounds at S = 1, and the scale
    overflow / peak from which it overflows (every value scales with S, exactly)."""
    probe = MixedPrecision(model, "fp16")
    probe.loss_and_grad(X, y)
    return probe.peak, FORMATS["fp16"].overflow / probe.peak


@dataclass(frozen=True)
class UnderflowResult:
    """One full-batch gradient of a trained MLP in each run of ``labels``, against fp32.

    ``lost_*[i]``: fraction of the entries that are nonzero in fp32 but 0 in run i, for
    the activation gradients G^1 .. G^L and for the weight gradient g;
    ``grad_error[i]`` = ||g_i - g_fp32|| / ||g_fp32||. ``fp32_activation_grads`` holds
    the |G| of the fp32 run (for a histogram); ``below_fp16`` is the fraction of them
    <= 2^-25, half fp16's smallest subnormal: those round to 0 (the prediction).
    """

    labels: tuple
    scales: np.ndarray
    lost_activation_grads: np.ndarray
    lost_weight_grads: np.ndarray
    grad_error: np.ndarray
    fp32_activation_grads: np.ndarray
    below_fp16: float


def underflow(epochs: int = 20, *, hidden: int = 128, seed: int = 0, scale: float | None = None,
              activation: str = "relu", data: Dataset | None = None) -> UnderflowResult:
    """Train in fp32 for ``epochs`` (late in training the gradients are small), then take
    the mean-loss gradient over the whole training set in fp16 with S = 1, fp16 with S =
    ``scale`` (default: the largest power of two that does not overflow, where a dynamic
    scaler settles) and bf16 with S = 1.

    ``activation``: the hidden layer's. bf16 rounds every value 8 times more coarsely than
    fp16 (7 mantissa bits against 10); with a smooth one ("tanh") its gradient error is
    close to 8 times fp16's, with ReLU only about 3 times: rounding a pre-activation near 0
    can switch the unit on or off, an all-or-nothing change with a chance proportional to
    the rounding, so that part of the error grows like the square root of the rounding."""
    epochs = checks.integer(epochs, "epochs", at_least=0)
    data = _digits(data)
    model = _digits_mlp(data, hidden, seed, activation)
    if epochs:
        train(model, data.X_train, data.y_train, epochs=epochs, seed=seed)
    X, y = model.check_batch(data.X_train, data.y_train)
    if scale is not None:
        scale = checks.real(scale, "scale", above=0)
    else:
        scale = 2.0 ** math.floor(math.log2(_limit_scale(model, X, y)[1]))
    runs = (("fp16, no scaling", "fp16", 1.0), (f"fp16, S=2^{math.log2(scale):g}", "fp16", scale),
            ("bf16, no scaling", "bf16", 1.0))

    def grads(fmt, s):
        mp = MixedPrecision(model, fmt, scaler=LossScaler(s, dynamic=False))
        g = mp.loss_and_grad(X, y, validate=False)[1].copy()
        return np.concatenate([mp.format.decode(G).ravel() for G in mp.activation_grads]), g

    G32, g32 = grads("fp32", 1.0)
    lost_G, lost_g, err = [], [], []
    for _, fmt, s in runs:
        G, g = grads(fmt, s)
        lost_G.append(np.mean(G[G32 != 0] == 0))
        lost_g.append(np.mean(g[g32 != 0] == 0))
        err.append(np.linalg.norm(g - g32) / np.linalg.norm(g32))
    return UnderflowResult(tuple(label for label, _, _ in runs), np.array([s for *_, s in runs]),
                           np.array(lost_G), np.array(lost_g), np.array(err), np.abs(G32),
                           float(np.mean(np.abs(G32) <= 2.0**-25)))


@dataclass(frozen=True)
class FormatsResult:
    """The runs of :data:`RUNS` (``labels``), from the same initial weights and batches."""

    labels: tuple
    histories: tuple  # one MixedHistory per run

    @property
    def test_accuracy(self) -> np.ndarray:
        return np.array([h.test_accuracy for h in self.histories])


def compare_formats(seed: int = 0, *, epochs: int = 10, batch_size: int = 32, lr: float = 0.1,
                    loss_weight: float = 1.0, hidden: int = 128, growth_interval: int = 100,
                    data: Dataset | None = None) -> FormatsResult:
    """Train the digits MLP with SGD in each run of :data:`RUNS`.

    The loss is ``loss_weight`` * C and the learning rate ``lr / loss_weight``: in fp32 the
    same training (bit for bit when loss_weight is a power of two), but every gradient is
    ``loss_weight`` times smaller, as for a loss term with a small weight or a mean over
    many more elements than the batch. The fp16 + scaling run starts at S = 2^16 and
    doubles S after ``growth_interval`` good steps: 100 here, because 10 epochs of digits
    at batch 32 are only 430 steps; PyTorch's ``GradScaler`` (and :class:`LossScaler`)
    default to 2000, for runs of many thousands of steps.
    """
    checks.integer(seed, "seed", at_least=0)
    loss_weight = checks.real(loss_weight, "loss_weight", above=0)
    lr = checks.real(lr, "lr", above=0)
    data = _digits(data)
    init_seed, shuffle_seed = np.random.SeedSequence(seed).spawn(2)  # as chapter 1's train_digits
    model = _digits_mlp(data, hidden, np.random.default_rng(init_seed))
    histories: list[MixedHistory] = []
    for _, fmt, scaled in RUNS:
        scaler = LossScaler(2.0**16, growth_interval) if scaled else None
        mp = MixedPrecision(model.copy(), fmt, scaler=scaler, loss_weight=loss_weight,
                            lr=lr / loss_weight)
        histories.append(train_mixed(mp, data.X_train, data.y_train, epochs=epochs,
                                     batch_size=batch_size, seed=np.random.default_rng(shuffle_seed),
                                     X_test=data.X_test, y_test=data.y_test))
    return FormatsResult(tuple(label for label, _, _ in RUNS), tuple(histories))


@dataclass(frozen=True)
class OverflowResult:
    """A dynamic fp16 scaler from ``initial_scale``, stepping on the same batch until a step
    is taken. ``limit_scale`` = overflow / ``peak`` is the S from which the backward overflows;
    ``predicted_skips`` = max(0, floor(log2(initial_scale / limit_scale)) + 1)."""

    initial_scale: float
    peak: float
    limit_scale: float
    predicted_skips: int
    scales: np.ndarray  # S of every step
    skipped: np.ndarray

    @property
    def skips(self) -> int:
        return int(self.skipped.sum())


def overflow(initial_scale: float = 2.0**24, *, seed: int = 0, batch_size: int = 32,
             hidden: int = 128, max_steps: int = 200, data: Dataset | None = None) -> OverflowResult:
    """Run :class:`LossScaler` (dynamic) from ``initial_scale`` on the first ``batch_size``
    training rows, repeated (a skipped step leaves the weights and so the gradient as they
    were), until a step is taken or ``max_steps`` steps have run."""
    initial_scale = checks.real(initial_scale, "initial_scale", above=0)
    max_steps = checks.integer(max_steps, "max_steps", at_least=1)
    data = _digits(data)
    model = _digits_mlp(data, hidden, seed)
    X, y = model.check_batch(data.X_train[:batch_size], data.y_train[:batch_size])
    peak, limit = _limit_scale(model, X, y)
    mp = MixedPrecision(model, "fp16", scaler=LossScaler(initial_scale))
    for _ in range(max_steps):
        mp.step(X, y, validate=False)
        if not mp.scaler.skipped[-1]:
            break
    ratio = initial_scale / limit
    predicted = math.floor(math.log2(ratio)) + 1 if ratio >= 1 else 0
    return OverflowResult(initial_scale, peak, limit, predicted, mp.scaler.scales, mp.scaler.skipped)
