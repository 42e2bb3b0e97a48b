"""Chapter 7's experiment: the ResNet-50 case study at 8 .. 4096 simulated GPUs (pure).

:func:`simulate_at_scale` composes :func:`coursekit.sim.step.scaling` (the scaling curve over
:data:`GPU_COUNTS`, 8 GPUs per node) and :func:`~coursekit.sim.step.simulate_step` (the step
at the chosen count) on the workload and network of :mod:`coursekit.sim.resnet50`. It is a
simulation: no rank runs, so it takes no runner, only its config (an :class:`AtScaleConfig`,
checked like every chapter's config) and returns an :class:`AtScaleResult`. Scaling efficiency
= throughput / (GPUs x one GPU without communication); stragglers: every GPU is slowed by
a factor exp(|N(0, sigma)|) (seeded) and a synchronous step waits for the slowest.
"""

from __future__ import annotations

from dataclasses import dataclass

from coursekit import checks

from . import resnet50
from .allreduce_time import ALGORITHMS
from .step import StepResult, Stragglers, scaling, simulate_step

__all__ = ["EPOCH_IMAGES", "GPU_COUNTS", "AtScaleConfig", "AtScaleResult", "simulate_at_scale"]

GPUS_PER_NODE = resnet50.CASE_STUDY["gpus_per_node"]
GPU_COUNTS = tuple(GPUS_PER_NODE << k for k in range(10))  # 8 .. 4096
EPOCH_IMAGES = resnet50.CASE_STUDY["epochs"] * resnet50.CASE_STUDY["imagenet_train_images"]


@dataclass(frozen=True)
class AtScaleConfig:
    """One setting of the case study: ``gpus`` (one of :data:`GPU_COUNTS`, whole nodes of 8),
    the allreduce ``algorithm`` ("ring": flat, "hierarchical": within nodes, then across),
    the tensor-fusion threshold ``fusion_bytes`` (0: one allreduce per tensor), ``fp16``
    gradients (half the bytes), ``batch`` images per GPU, the straggler ``jitter`` sigma,
    and ``network``: keyword arguments of :func:`coursekit.sim.resnet50.case_study_network`
    (bandwidths, latencies; None: the case study's)."""

    gpus: int = 1024
    algorithm: str = "hierarchical"
    fusion_bytes: int = 64 << 20
    fp16: bool = True
    batch: int = 64
    jitter: float = 0.0
    network: dict | None = None

    def __post_init__(self):
        if checks.integer(self.gpus, "gpus") not in GPU_COUNTS:
            raise ValueError(f"gpus must be one of {GPU_COUNTS} (whole nodes of {GPUS_PER_NODE}), "
                             f"got {self.gpus!r}")
        if checks.instance(self.algorithm, "algorithm", str) not in ALGORITHMS:
            raise ValueError(f"unknown allreduce algorithm {self.algorithm!r}; allowed: "
                             f"{ALGORITHMS}")
        checks.integer(self.fusion_bytes, "fusion_bytes", at_least=0,
                       hint=" (the tensor-fusion threshold; 0: one allreduce per tensor)")
        checks.boolean(self.fp16, "fp16")
        checks.integer(self.batch, "batch", at_least=1, hint=" (images per GPU)")
        checks.real(self.jitter, "jitter", at_least=0, hint=" (the straggler sigma)")
        if self.network is not None:
            checks.instance(self.network, "network", dict,
                            " of case_study_network's keyword arguments, or None")


@dataclass(frozen=True)
class AtScaleResult:
    """One setting (``config``): the step at its GPU count and the curve over
    :data:`GPU_COUNTS`."""

    config: AtScaleConfig
    step: StepResult
    efficiency: float     # throughput / (gpus x one GPU without communication)
    images_per_s: float
    minutes_90_epochs: float
    slowest: float        # the slowest GPU's compute factor (stragglers)
    curve: dict           # scaling(): gpus, throughput, efficiency, step_s, exposed_comm_s

    @property
    def gpus(self) -> int:
        return self.config.gpus


def simulate_at_scale(config: AtScaleConfig) -> AtScaleResult:
    """The case study at one setting (pure)."""
    checks.instance(config, "config", AtScaleConfig)
    work = resnet50.workload(batch=config.batch)
    net = resnet50.case_study_network(config.gpus // GPUS_PER_NODE, **(config.network or {}))
    options = dict(algorithm=config.algorithm, fusion_bytes=config.fusion_bytes,
                   fp16=config.fp16,
                   stragglers=Stragglers(jitter=config.jitter) if config.jitter else None)
    curve = scaling(work, net, [g // GPUS_PER_NODE for g in GPU_COUNTS], **options)
    step = simulate_step(work, net, **options)
    i = GPU_COUNTS.index(config.gpus)
    slowest = float(options["stragglers"].factors(config.gpus).max()) if config.jitter else 1.0
    return AtScaleResult(config, step, float(curve["efficiency"][i]), step.throughput,
                         EPOCH_IMAGES / step.throughput / 60, slowest, curve)
