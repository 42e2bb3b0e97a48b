"""Chapter 7's experiment: the ResNet-50 case study at 8 .. 4096 simulated GPUs (pure).

:func:`simulate_at_scale` composes :func:`coursekit.sim.step.scaling` (the scaling curve over
:data:`GPU_COUNTS`, 8 GPUs per node) and :func:`~coursekit.sim.step.simulate_step` (the step
at the chosen count) on the workload and network of :mod:`coursekit.sim.resnet50`. It is a
simulation: no rank runs, so it takes settings, not a runner. Scaling efficiency
= throughput / (GPUs x one GPU without communication); stragglers: every GPU is slowed by
a factor exp(|N(0, sigma)|) (seeded) and a synchronous step waits for the slowest.
"""

from __future__ import annotations

from dataclasses import dataclass

from coursekit import checks

from . import resnet50
from .step import StepResult, Stragglers, scaling, simulate_step

__all__ = ["EPOCH_IMAGES", "GPU_COUNTS", "AtScaleResult", "simulate_at_scale"]

GPUS_PER_NODE = resnet50.CASE_STUDY["gpus_per_node"]
GPU_COUNTS = tuple(GPUS_PER_NODE << k for k in range(10))  # 8 .. 4096
EPOCH_IMAGES = resnet50.CASE_STUDY["epochs"] * resnet50.CASE_STUDY["imagenet_train_images"]


@dataclass(frozen=True)
class AtScaleResult:
    """One setting: the step at ``gpus`` and the curve over :data:`GPU_COUNTS`."""

    gpus: int
    step: StepResult
    efficiency: float     # throughput / (gpus x one GPU without communication)
    images_per_s: float
    minutes_90_epochs: float
    slowest: float        # the slowest GPU's compute factor (stragglers)
    curve: dict           # scaling(): gpus, throughput, efficiency, step_s, exposed_comm_s


def simulate_at_scale(gpus: int = 1024, algorithm: str = "hierarchical",
                      fusion_bytes: int = 64 << 20, fp16: bool = True, batch: int = 64,
                      jitter: float = 0.0, network: dict | None = None) -> AtScaleResult:
    """The case study at one setting (pure). ``network``: keyword arguments of
    :func:`coursekit.sim.resnet50.case_study_network` (bandwidths, latencies)."""
    if gpus not in GPU_COUNTS:
        raise ValueError(f"gpus must be one of {GPU_COUNTS} (whole nodes of {GPUS_PER_NODE}), "
                         f"got {gpus!r}")
    checks.integer(fusion_bytes, "fusion_bytes", at_least=0,
                   hint=" (the tensor-fusion threshold; 0: one allreduce per tensor)")
    work = resnet50.workload(batch=batch)
    net = resnet50.case_study_network(gpus // GPUS_PER_NODE, **(network or {}))
    options = dict(algorithm=algorithm, fusion_bytes=fusion_bytes, fp16=fp16,
                   stragglers=Stragglers(jitter=jitter) if jitter else None)
    curve = scaling(work, net, [g // GPUS_PER_NODE for g in GPU_COUNTS], **options)
    step = simulate_step(work, net, **options)
    i = GPU_COUNTS.index(gpus)
    slowest = float(options["stragglers"].factors(gpus).max()) if jitter else 1.0
    return AtScaleResult(gpus, step, float(curve["efficiency"][i]), step.throughput,
                         EPOCH_IMAGES / step.throughput / 60, slowest, curve)
