"""Mixed-precision training of the chapter-1 MLP, with (dynamic) loss scaling.

Micikevicius et al. (2018), as in apex and PyTorch's autocast + GradScaler: the weights
that the optimizer updates stay in fp32 (the *master* copy, ``model.params``); every step

1. casts them to the 16-bit format ("fp16" or "bf16"; "fp32" runs the same path in fp32);
2. runs forward and backward in that format, with the output gradient multiplied by the
   loss scale S (dC/dZ^L -> S dC/dZ^L: the same as backpropagating S * C);
3. turns the 16-bit gradient into fp32 and unscales it there, g = g16 / S;
4. if g has an inf or NaN (something overflowed), skips the update; else the optimizer
   updates the master weights with g. A :class:`LossScaler` picks S.

Why: a gradient below fp16's smallest subnormal 2^-24 ~ 6e-8 rounds to 0 (underflow);
multiplying by S = 2^k shifts every value k binades up, exactly (a power of two changes
only the exponent), into fp16's range, and the division in fp32 shifts it back, where
nothing underflows. Too large an S overflows (values from 65520 up become inf): the
dynamic scaler then halves S and retries on the next batch.

The emulated 16-bit GPU
-----------------------
NumPy has no 16-bit matrix product, so each operation that a GPU runs as one kernel reads
16-bit inputs, computes in fp32 (a GEMM accumulates in fp32, as tensor cores do) and
rounds its output once to the format (:mod:`coursekit.nn.precision`), when it writes it.
The kernels are the MLP's own (``Layer.forward`` / ``Layer.backward`` of
:class:`~coursekit.nn.mlp.MLP`, run in fp32 on the 16-bit values):

    W16, b16  = round(W), round(b)                              (the cast, once a step)
    A^0       = round(X)
    A^l       = round(sigma(A^{l-1} W16 + b16))                 (GEMM + bias/activation epilogue)
    C, dC/dZ^L from A^L in fp32                                 (autocast keeps the loss in fp32)
    G^L       = round(S * dC/dZ^L)
    delta^l   = G^l * sigma'(A^l)                               (fp32, fused into the GEMMs)
    dW16      = round(A^{l-1}^T delta^l),  db16 = round(sum_rows delta^l)
    G^{l-1}   = round(delta^l W16^T)
    g         = fp32(dW16, db16) / S                            (unscale in fp32)

With fmt="fp32" every round is the identity, so the step is the MLP's own fp32 step
(tested against its float64 gradient).

On a GPU (``device="cuda"``)
----------------------------
The same equations run as real 16-bit kernels
(:func:`coursekit.nn.kernels_cuda.loss_and_grad_mixed`): weights, activations, activation
gradients and the weight gradient are float16 arrays on the device; every GEMM reads them,
accumulates in float32 registers and rounds once on its store; the loss and delta^l stay in
float32. The master weights, the unscaling and the optimizer stay on the host (one upload
of W16 and the batch, one download of the 16-bit gradient a step). ``activations`` and
``activation_grads`` are then device arrays (``.copy_to_host()``), and ``peak`` is taken
after the rounding to 16 bits (the emulation takes it before; they differ by at most one
rounding, and agree on inf). bf16 has no numba type, so it runs only in the emulation.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass

import numpy as np

from coursekit import checks
from coursekit.data import minibatches
from coursekit.nn import layout, reference
from coursekit.nn.mlp import DEVICES, MLP, resolve_device
from coursekit.nn.optim import make_optimizer
from coursekit.nn.precision import get_format
from coursekit.nn.train import History

__all__ = ["LossScaler", "MemoryReport", "MixedHistory", "MixedPrecision", "train_mixed"]


_GPU_FORMATS = ("fp16", "fp32")  # formats with a numba type (the kernels' storage)


def _absmax(x: np.ndarray) -> float:
    """max |x|, inf when x holds a NaN (a NaN here comes from an overflow: inf * 0)."""
    m = float(np.max(np.abs(x)))
    return math.inf if math.isnan(m) else m


def _resolve_device(device, fmt: str) -> str:
    """"cpu" or "cuda" for :class:`MixedPrecision` (see its ``device``)."""
    if device not in DEVICES:
        raise ValueError(f"device={device!r} is not supported; allowed: {', '.join(DEVICES)}")
    if fmt not in _GPU_FORMATS:
        if device == "cuda":
            raise ValueError(f"fmt={fmt!r} cannot run on device='cuda': numba has no bfloat16 "
                             f"type; use fmt='fp16' or 'fp32' on the GPU, or device='cpu' (the "
                             f"emulation)")
        return "cpu"
    return resolve_device(device)


class LossScaler:
    """The loss scale S, like PyTorch's ``GradScaler`` (apex's dynamic loss scaler).

    After each step, ``update(found_inf)``:

    * found_inf (the unscaled gradient has an inf or NaN): the step is skipped and
      S <- S / 2 (dynamic only); the count of good steps restarts at 0;
    * otherwise the step is taken; after ``growth_interval`` good steps in a row
      S <- 2 S (dynamic only) and the count restarts.

    ``dynamic=False`` keeps S fixed (``LossScaler(1, dynamic=False)`` is "no loss
    scaling"); a non-finite gradient still skips the step, so inf never reaches the
    weights. ``scales[t]`` is the S that step t used, ``skipped[t]`` whether it was skipped.
    """

    def __init__(self, init_scale: float = 2.0**16, growth_interval: int = 2000, *,
                 dynamic: bool = True):
        self.scale = checks.real(init_scale, "init_scale", above=0)
        self.growth_interval = checks.integer(growth_interval, "growth_interval", at_least=1)
        self.dynamic = checks.boolean(dynamic, "dynamic")
        self.good_steps = 0
        self._scales: list[float] = []
        self._skipped: list[bool] = []

    def update(self, found_inf: bool) -> bool:
        """Record the step that used the current S; return True when it may update the weights."""
        self._scales.append(self.scale)
        self._skipped.append(bool(found_inf))
        if found_inf:
            self.good_steps = 0
            if self.dynamic:
                self.scale /= 2
            return False
        self.good_steps += 1
        if self.good_steps == self.growth_interval:
            self.good_steps = 0
            if self.dynamic:
                self.scale *= 2
        return True

    @property
    def scales(self) -> np.ndarray:
        return np.array(self._scales)

    @property
    def skipped(self) -> np.ndarray:
        return np.array(self._skipped, dtype=bool)

    def __repr__(self) -> str:
        kind = "dynamic" if self.dynamic else "static"
        return f"LossScaler(scale={self.scale:g}, {kind}, steps={len(self._scales)})"


@dataclass(frozen=True)
class MemoryReport:
    """Bytes a mixed-precision step holds, by category (each from the real buffer's nbytes)."""

    master_weights: int   # fp32 params, updated by the optimizer
    low_weights: int      # their 16-bit copy (2 bytes a value; 4 with fmt="fp32")
    low_grads: int        # the 16-bit gradient the backward writes
    master_grads: int     # the unscaled fp32 gradient the optimizer reads
    optimizer_state: int  # e.g. momentum's velocity (0 for plain SGD)
    activations: int      # the 16-bit A^0 .. A^L of the last step, kept for the backward

    @property
    def total(self) -> int:
        return sum(dataclasses.astuple(self))


class MixedPrecision:
    """Train ``model`` (a float32 :class:`~coursekit.nn.mlp.MLP`, its ``params`` the fp32
    master weights) in the 16-bit format ``fmt`` with the loss scaling of ``scaler``.

    ``scaler``: a :class:`LossScaler`, or None for no loss scaling (a static S = 1).
    ``loss_weight``: the loss is loss_weight * C (a weighted term of a larger loss; a small
    weight makes every gradient small).
    ``optimizer``: anything with ``step(grad)`` on ``model.params``; default SGD(lr),
    or momentum SGD when ``momentum > 0``.
    ``device``: "cpu" (default: the NumPy emulation, its fp32 GEMMs on ``model``'s own
    backend), "cuda" (real float16 kernels on the GPU: fmt "fp16" or "fp32"; "bf16" is
    refused with a ValueError, as is "cuda" without a usable GPU) or "auto" ("cuda" when a
    GPU is usable and the format runs there, else "cpu"). Loss scaling is the same on both.
    """

    def __init__(self, model: MLP, fmt: str = "fp16", *, scaler: LossScaler | None = None,
                 loss_weight: float = 1.0, lr: float = 0.1, momentum: float = 0.0,
                 optimizer=None, device: str = "cpu"):
        checks.instance(model, "model", MLP, " (coursekit.nn.MLP)")
        if model.dtype != np.float32:
            raise ValueError(f"model must be a float32 MLP (its params are the fp32 master "
                             f"weights); got {model.dtype.name}: use model.copy(dtype=np.float32)")
        self.model = model
        self.loss_weight = checks.real(loss_weight, "loss_weight", above=0)
        self.format = get_format(fmt)
        self.device = _resolve_device(device, self.format.name)
        self.scaler = LossScaler(1.0, dynamic=False) if scaler is None else checks.instance(
            scaler, "scaler", LossScaler, " or None")
        if optimizer is None:
            optimizer = make_optimizer(model.params, lr, momentum)
        elif not callable(getattr(optimizer, "step", None)):
            raise TypeError(f"optimizer must have a step(grad) method (e.g. coursekit.nn.SGD); "
                            f"got {optimizer!r:.60}")
        self.optimizer = optimizer
        self.weights16 = self.format.encode(model.params)
        self.grad16 = np.zeros_like(self.weights16)
        self.grad = np.zeros_like(model.params)  # the unscaled fp32 gradient
        self.activations: list[np.ndarray] = []  # 16-bit A^0 .. A^L of the last step
        self.activation_grads: list[np.ndarray] = []  # its 16-bit scaled G^1 .. G^L
        self.peak = 0.0  # largest |value| the last scaled backward rounded to 16 bits
        # emulation only (a GPU reads the 16-bit buffers directly): their fp32 values
        self._weights32 = np.empty_like(model.params)
        self._grad32 = np.empty_like(model.params)
        self._layers = [dataclasses.replace(layer, W=W, b=b) for layer, (W, b) in
                        zip(model.layers, layout.views(self._weights32, model.sizes))]

    def _cast_weights(self) -> None:
        self.weights16[...] = self.format.encode(self.model.params)
        self._weights32[...] = self.format.decode(self.weights16)

    def _encode_batch(self, X: np.ndarray) -> np.ndarray:
        return self.format.encode(X).reshape(X.shape)

    def _forward(self, X: np.ndarray) -> list[np.ndarray]:
        """The 16-bit activations A^0 .. A^L of X under the current 16-bit weights."""
        fmt = self.format
        acts = [fmt.encode(X)]
        with np.errstate(over="ignore", invalid="ignore"):
            for layer in self._layers:
                acts.append(fmt.encode(layer.forward(fmt.decode(acts[-1]))))
        return acts

    def forward(self, X) -> np.ndarray:
        """The network's output computed in the 16-bit format (fp32 values)."""
        X = self.model.check_inputs(X)
        if self.device == "cuda":
            from coursekit.nn import kernels_cuda

            self.weights16[...] = self.format.encode(self.model.params)
            m = self.model
            return self.format.decode(kernels_cuda.forward(self.weights16, m._sizes_arr, m._act,
                                                           self._encode_batch(X)))
        self._cast_weights()
        return self.format.decode(self._forward(X)[-1])

    def accuracy(self, X, y) -> float:
        """Fraction of rows whose predicted class (argmax of :meth:`forward`) equals the label."""
        y = np.asarray(y)
        out = self.forward(X)
        if y.ndim != 1 or len(y) != len(out):
            raise ValueError(f"y must be 1-D with one label per row of X ({len(out)}); "
                             f"got shape {y.shape}")
        return float(np.mean(np.argmax(out, axis=1) == y))

    def loss_and_grad(self, X, y, *, validate: bool = True) -> tuple[float, np.ndarray]:
        """(loss_weight * C in fp32, unscaled fp32 gradient g) of one emulated step (see the
        module docstring).

        ``g`` is the buffer ``self.grad`` (inf or NaN where the scaled backward overflowed);
        ``self.peak`` is the largest |value| the scaled backward rounded to 16 bits (every
        value is S times its S = 1 value, so it overflows from S = fmt.overflow / peak_1).
        ``validate=False`` skips the input checks (arrays from ``model.check_batch``).
        """
        if validate:
            X, y = self.model.check_batch(X, y)
        fmt, scale = self.format, self.scaler.scale
        if self.device == "cuda":
            return self._loss_and_grad_cuda(X, y, scale)
        self._cast_weights()
        self.activations = self._forward(X)
        loss, delta = (reference.softmax_xent if self.model.loss == "softmax_xent"
                       else reference.mse)(fmt.decode(self.activations[-1]), y)
        with np.errstate(over="ignore", invalid="ignore"):  # inf * 0 once S overflowed
            g = delta * np.float32(self.loss_weight * scale)
            peak, self.activation_grads = _absmax(g), []
            for layer in reversed(self._layers):
                i = layer.index
                self.activation_grads.insert(0, fmt.encode(g))
                g, _ = layer.backward(fmt.decode(self.activations[i]),
                                      fmt.decode(self.activations[i + 1]),
                                      fmt.decode(self.activation_grads[0]),
                                      grad=self._grad32[layer.span], input_grad=i > 0)
                if g is not None:
                    peak = max(peak, _absmax(g))
            self.peak = max(peak, _absmax(self._grad32))
            self.grad16[...] = fmt.encode(self._grad32)
            np.divide(fmt.decode(self.grad16), np.float32(scale), out=self.grad)
        return self.loss_weight * loss, self.grad

    def _loss_and_grad_cuda(self, X, y, scale: float) -> tuple[float, np.ndarray]:
        """:meth:`loss_and_grad` with the 16-bit kernels on the GPU (see the module docstring)."""
        from coursekit.nn import kernels_cuda

        fmt, m = self.format, self.model
        self.weights16[...] = fmt.encode(m.params)
        with np.errstate(over="ignore", invalid="ignore"):
            step = kernels_cuda.loss_and_grad_mixed(
                self.weights16, self.grad16, m._sizes_arr, m._act, self._encode_batch(X), y,
                loss=m.loss, scale=self.loss_weight * scale)
            self.activations, self.activation_grads = step.activations, step.activation_grads
            grad16 = fmt.decode(self.grad16)
            self.peak = max(step.peak, _absmax(grad16))
            np.divide(grad16, np.float32(scale), out=self.grad)
        return self.loss_weight * step.loss, self.grad

    def step(self, X, y, *, validate: bool = True) -> float:
        """One training step on the batch (X, y); returns the loss. The update is skipped
        (``scaler.skipped[-1]``) when the unscaled gradient is not finite."""
        loss, grad = self.loss_and_grad(X, y, validate=validate)
        if self.scaler.update(found_inf=not np.isfinite(grad).all()):
            self.optimizer.step(grad)
        return loss

    def memory(self) -> MemoryReport:
        """The bytes this step holds, by category.

        Not counted: the activation gradients G^l (a backward frees each one once the layer
        below has used it; ``activation_grads`` keeps them only for inspection) and the fp32
        copies that only the NumPy emulation needs (decoded weights, fp32 GEMM outputs).
        """
        state = sum(v.nbytes for v in vars(self.optimizer).values()
                    if isinstance(v, np.ndarray) and v is not self.model.params)
        return MemoryReport(self.model.params.nbytes, self.weights16.nbytes, self.grad16.nbytes,
                            self.grad.nbytes, state, sum(a.nbytes for a in self.activations))

    def __repr__(self) -> str:
        where = "" if self.device == "cpu" else f", device={self.device!r}"
        return f"MixedPrecision({self.format.name}, {self.scaler!r}, {self.model!r}{where})"


@dataclass(frozen=True)
class MixedHistory:
    """The curves of :func:`train_mixed` and, for every step, its loss scale and whether it
    was skipped. Accuracies are those of the 16-bit forward."""

    history: History
    scales: np.ndarray
    skipped: np.ndarray

    @property
    def test_accuracy(self) -> float:
        return float(self.history.test_accuracy[-1])


def train_mixed(mp: MixedPrecision, X, y, *, epochs: int = 20, batch_size: int = 32, seed=0,
                X_test=None, y_test=None) -> MixedHistory:
    """:func:`coursekit.nn.train`'s loop with :meth:`MixedPrecision.step` as the step.

    ``seed`` (int or Generator) drives the per-epoch shuffling, as there.
    """
    checks.instance(mp, "mp", MixedPrecision)
    epochs = checks.integer(epochs, "epochs", at_least=1)
    batch_size = checks.integer(batch_size, "batch_size", at_least=1)
    rng = checks.rng(seed)
    X, y = mp.model.check_batch(X, y)
    if (X_test is None) != (y_test is None):
        raise ValueError("pass both X_test and y_test, or neither")
    labels = y if y.ndim == 1 else np.argmax(y, axis=1)
    first_step, start = len(mp.scaler.scales), time.perf_counter()
    step_loss, curves = [], {"train_loss": [], "train_accuracy": [], "test_accuracy": []}
    for _ in range(epochs):
        first = len(step_loss)
        for Xb, yb in minibatches(X, y, batch_size, rng):
            step_loss.append(mp.step(Xb, yb, validate=False))
        curves["train_loss"].append(float(np.mean(step_loss[first:])))
        curves["train_accuracy"].append(mp.accuracy(X, labels))
        curves["test_accuracy"].append(math.nan if X_test is None else mp.accuracy(X_test, y_test))
    history = History(**{k: np.array(v) for k, v in curves.items()}, step_loss=np.array(step_loss),
                      seconds=time.perf_counter() - start)
    return MixedHistory(history, mp.scaler.scales[first_step:], mp.scaler.skipped[first_step:])
