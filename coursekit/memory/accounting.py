"""Bytes per GPU by category: parameters, gradients, optimizer states, activations.

Model states (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
Trillion Parameter Models", Sec. 3.1 and 5): with P, G and K bytes per parameter for the
weights, the gradients and the optimizer states (:func:`bytes_per_param`), Ψ' = Ψ/(t p)
parameters on a GPU (t tensor-parallel ranks, p pipeline stages, each an equal share) and
ZeRO over N data-parallel GPUs:

=====  =============================  ===========================
stage  partitions                     bytes per GPU
=====  =============================  ===========================
0      nothing (plain data parallel)  (P + G + K) Ψ'
1      optimizer states               (P + G) Ψ' + K Ψ'/N
2      + gradients                    P Ψ' + (G + K) Ψ'/N
3      + parameters                   (P + G + K) Ψ'/N
=====  =============================  ===========================

Mixed-precision Adam (P = G = 2, K = 12) gives the paper's (2 + 2 + K)Ψ, (2 + 2)Ψ + KΨ/N,
2Ψ + (2 + K)Ψ/N and (2 + 2 + K)Ψ/N. (:mod:`coursekit.parallel.zero` runs the stages on
the MLP; its table pads shards to whole chunks and, in fp32/fp64, gives stages 1-2 a
master copy of the shard.)

Activations: micro-batch b times what one sample keeps (:class:`~coursekit.memory.shapes.
ModelShape`), at 2 bytes a value in 16-bit training (4 in fp32, 8 in fp64):
``kept + kept_split / t``, or ``checkpoint`` with full recomputation (plus, while a layer
is recomputed, that layer's own activations: not counted, as in Korthikanti et al.).
Pipeline: 1F1B with m micro-batches; its first stage holds min(p, m) micro-batches in
flight of its L/p layers, so activations are the whole model's times min(p, m)/p: with
m >= p, p does not divide them (GPipe would hold all m: m/p times the whole model's;
:func:`coursekit.parallel.pipeline.simulate.peak_activations` counts any schedule's).
Not counted: the embedding on the first stage, temporary buffers (ZeRO-R's),
fragmentation, the CUDA context.
"""

from __future__ import annotations

from dataclasses import dataclass

from coursekit import checks
from coursekit.memory.shapes import ModelShape

__all__ = ["OPTIMIZERS", "PRECISIONS", "MemoryBreakdown", "TrainingSetup", "bytes_per_param",
           "memory_per_gpu"]

PRECISIONS = {"fp64": 8, "fp32": 4, "fp16": 2, "bf16": 2}
"""Bytes of a weight, a gradient and an activation value. 16-bit means mixed precision."""

OPTIMIZERS = {"sgd": 0, "momentum": 1, "adam": 2}
"""Optimizer state buffers per parameter: none, the velocity, Adam's two moments."""


def _choice(value, name: str, allowed) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a string, one of {', '.join(allowed)}; got {value!r:.60}")
    if value not in allowed:
        raise ValueError(f"{name}={value!r} is not supported; allowed: {', '.join(allowed)}")
    return value


def bytes_per_param(precision: str, optimizer: str) -> tuple[int, int, int]:
    """(P, G, K): bytes per parameter of the weights, the gradient, the optimizer states.

    fp64, fp32: P = G = itemsize, K = buffers x itemsize (no master copy).
    fp16, bf16 (mixed precision, ZeRO's accounting): P = G = 2; K = 4 for the fp32 master
    weights + 4 per fp32 buffer: SGD 4, momentum 8, Adam 12.
    """
    itemsize = PRECISIONS[_choice(precision, "precision", PRECISIONS)]
    buffers = OPTIMIZERS[_choice(optimizer, "optimizer", OPTIMIZERS)]
    if itemsize == 2:
        return 2, 2, 4 + 4 * buffers
    return itemsize, itemsize, itemsize * buffers


@dataclass(frozen=True, kw_only=True)
class TrainingSetup:
    """How a model is trained: precision, optimizer, ZeRO ``stage`` over ``dp`` data-parallel
    GPUs (N), ``tp`` tensor-parallel ranks (t), ``pp`` pipeline stages (p), ``micro_batch``
    samples (b), ``micro_batches`` per step (m), full activation ``recompute`` on or off."""

    precision: str = "bf16"
    optimizer: str = "adam"
    stage: int = 0
    dp: int = 1
    tp: int = 1
    pp: int = 1
    micro_batch: int = 1
    micro_batches: int = 1
    recompute: bool = False

    def __post_init__(self):
        _choice(self.precision, "precision", PRECISIONS)
        _choice(self.optimizer, "optimizer", OPTIMIZERS)
        checks.integer(self.stage, "stage", at_least=0, at_most=3, hint=" (the ZeRO stage)")
        for name, hint in (("dp", " (N, the data-parallel GPUs)"), ("tp", " (t, tensor-parallel "
                           "ranks)"), ("pp", " (p, pipeline stages)"), ("micro_batch", " (b)"),
                           ("micro_batches", " (m, per step)")):
            checks.integer(getattr(self, name), name, at_least=1, hint=hint)
        checks.boolean(self.recompute, "recompute")

    @property
    def itemsize(self) -> int:
        """Bytes of a weight, a gradient and an activation value."""
        return PRECISIONS[self.precision]


@dataclass(frozen=True)
class MemoryBreakdown:
    """Bytes one GPU holds, by category."""

    parameters: float
    gradients: float
    optimizer_states: float
    activations: float

    @property
    def total(self) -> float:
        return self.parameters + self.gradients + self.optimizer_states + self.activations

    def fits(self, gpu_bytes) -> bool:
        """total <= gpu_bytes (e.g. 80e9 for an 80 GB GPU)."""
        return self.total <= checks.real(gpu_bytes, "gpu_bytes", above=0)


def memory_per_gpu(model: ModelShape, setup: TrainingSetup) -> MemoryBreakdown:
    """Bytes per GPU of training ``model`` with ``setup`` (the formulas of the module docstring)."""
    checks.instance(model, "model", ModelShape, " (coursekit.memory.ModelShape or a preset)")
    checks.instance(setup, "setup", TrainingSetup, " (coursekit.memory.TrainingSetup)")
    P, G, K = bytes_per_param(setup.precision, setup.optimizer)
    local = model.n_params / (setup.tp * setup.pp)
    N = setup.dp
    it = setup.itemsize
    if setup.recompute and model.checkpoint is not None:
        per_sample = model.checkpoint.nbytes(it)
    else:
        per_sample = model.kept.nbytes(it) + model.kept_split.nbytes(it) / setup.tp
    in_flight = min(setup.pp, setup.micro_batches) / setup.pp
    return MemoryBreakdown(
        parameters=P * local / (N if setup.stage >= 3 else 1),
        gradients=G * local / (N if setup.stage >= 2 else 1),
        optimizer_states=K * local / (N if setup.stage >= 1 else 1),
        activations=setup.micro_batch * in_flight * per_sample,
    )
