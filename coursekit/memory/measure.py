"""Measured equals formula: the bytes chapter 1's MLP really holds in a training step.

:func:`measure_mlp` builds a :class:`~coursekit.nn.MLP` and its optimizer, runs one
forward and backward on a micro-batch layer by layer (``Layer.forward`` /
``Layer.backward``: the kernels of the fused step, in the order of
:mod:`coursekit.nn.kernels_cpu`, which keeps A^1, ..., A^L, in one block, through the
backward), and sums the ``nbytes`` of the buffers it holds (the activations at the end
of the forward pass, the gradient after the backward), each memory block once (the
layers' W and b are views into the flat buffer: they cost nothing). All four categories
are exact: :func:`~coursekit.memory.accounting.memory_per_gpu` of
:func:`~coursekit.memory.shapes.mlp_shape` predicts them to the byte.

What the formula leaves out shows in ``step_peak``: tracemalloc's peak while the fused
``mlp.loss_and_grad`` runs (Numba's allocations go through Python's allocator, so
tracemalloc sees them). Above the kept A^1..A^L it holds, at layer l of the backward
(:func:`fused_step_transient_bytes`), the upstream gradient G^{l+1} (b n_{l+1}; for the
top layer it is computed in place in A^L), the new G^l (b n_l, not made for the first
layer) and a C-ordered copy of W^T (n_l n_{l+1}, for a W of at most
``kernels_cpu._SMALL_W`` values, not for the first layer), plus 688-800 bytes (for the
nets of the tests) that do not grow with the batch: Numba's header on each array it
allocates.
So ``step_peak`` is not predicted to the byte; the batch-dependent part is.
"""

from __future__ import annotations

import tracemalloc
from dataclasses import dataclass

import numpy as np

from coursekit import checks
from coursekit.memory.accounting import MemoryBreakdown, TrainingSetup
from coursekit.nn import kernels_cpu, layout, reference
from coursekit.nn.mlp import MLP, check_dtype
from coursekit.nn.optim import SGD, Momentum

__all__ = ["MEASURABLE_OPTIMIZERS", "MlpMeasurement", "fused_step_transient_bytes", "measure_mlp"]

MEASURABLE_OPTIMIZERS = {"sgd": SGD, "momentum": Momentum}
"""The optimizers coursekit.nn has (no Adam: its state is formula only)."""

_PRECISION = {np.dtype(np.float32): "fp32", np.dtype(np.float64): "fp64"}


@dataclass(frozen=True)
class MlpMeasurement:
    """``memory``: bytes held (exact); ``setup``: the set-up that reproduces it with
    :func:`memory_per_gpu`; ``grad``: the measured backward's gradient; ``step_peak``:
    the fused step's peak allocation (tracemalloc, bytes above what it started with)."""

    memory: MemoryBreakdown
    setup: TrainingSetup
    grad: np.ndarray
    step_peak: int


def _held_bytes(arrays, exclude=()) -> int:
    """Bytes of the distinct memory blocks behind ``arrays`` (views count once), leaving
    out the blocks behind ``exclude``."""
    def owner(a):
        while isinstance(a.base, np.ndarray):
            a = a.base
        return a

    skip = {id(owner(a)) for a in exclude}
    blocks = {id(o): o for o in map(owner, arrays) if id(o) not in skip}
    return sum(o.nbytes for o in blocks.values())


def _peak_allocated(fn) -> int:
    """Peak bytes allocated while ``fn()`` runs, above what was allocated when it started."""
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        before, _ = tracemalloc.get_traced_memory()
        fn()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        if not tracing:
            tracemalloc.stop()
    return peak - before


def measure_mlp(sizes, *, micro_batch: int, dtype=np.float32, optimizer: str = "sgd",
                seed: int = 0) -> MlpMeasurement:
    """Build MLP(``sizes``, ``dtype``) and its ``optimizer``, run one step's forward and
    backward on ``micro_batch`` random rows, and measure what it holds (module docstring)."""
    checks.integer(micro_batch, "micro_batch", at_least=1)
    if optimizer not in MEASURABLE_OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r} cannot be measured: coursekit.nn has no "
                         f"such optimizer; allowed: {', '.join(MEASURABLE_OPTIMIZERS)}")
    mlp = MLP(sizes, dtype=dtype, seed=seed)
    opt = MEASURABLE_OPTIMIZERS[optimizer](mlp.params, lr=0.1)
    checks.fits_in_memory(2 * micro_batch * sum(mlp.sizes) * 8, "micro_batch",
                          "the micro-batch's inputs and activations")
    rng = checks.rng(seed)
    X = rng.standard_normal((micro_batch, mlp.sizes[0])).astype(mlp.dtype)
    y = rng.integers(0, mlp.n_classes, micro_batch)

    acts = [X]
    for layer in mlp.layers:
        acts.append(layer.forward(acts[-1]))
    activations = _held_bytes(acts)
    _, g = reference.softmax_xent(acts[-1], y)  # delta^L = dC/dA^L: the output layer is linear
    grad = np.empty_like(mlp.params)
    for i in reversed(range(len(mlp.layers))):
        layer = mlp.layers[i]
        g, _ = layer.backward(acts[i], acts[i + 1], g, grad=grad[layer.span], input_grad=i > 0)

    held = [mlp.params] + [a for layer in mlp.layers for a in (layer.W, layer.b)]
    memory = MemoryBreakdown(
        parameters=_held_bytes(held),
        gradients=_held_bytes([grad]),
        optimizer_states=_held_bytes(
            [v for v in vars(opt).values() if isinstance(v, np.ndarray)], exclude=held),
        activations=activations,
    )
    setup = TrainingSetup(precision=_PRECISION[mlp.dtype], optimizer=optimizer,
                          micro_batch=micro_batch)
    out = np.empty_like(mlp.params)
    mlp.loss_and_grad(X, y, out=out, validate=False)  # compiled and warm before it is measured
    peak = _peak_allocated(lambda: mlp.loss_and_grad(X, y, out=out, validate=False))
    return MlpMeasurement(memory, setup, grad, peak)


def fused_step_transient_bytes(sizes, micro_batch: int, dtype=np.float32) -> int:
    """The most the fused backward holds at once above the kept activations:
    max over layers l (0-based) of  b n_{l+1} [l < L-1] + b n_l [l > 0]
    + n_l n_{l+1} [l > 0 and n_l n_{l+1} <= kernels_cpu._SMALL_W], times the itemsize."""
    sizes = layout.check_sizes(sizes)
    b = checks.integer(micro_batch, "micro_batch", at_least=1)
    L = len(sizes) - 1
    most = 0
    for l in range(L):
        upstream = b * sizes[l + 1] if l < L - 1 else 0
        new = b * sizes[l] if l > 0 else 0
        w = sizes[l] * sizes[l + 1]
        w_copy = w if l > 0 and w <= kernels_cpu._SMALL_W else 0
        most = max(most, upstream + new + w_copy)
    return most * check_dtype(dtype).itemsize
