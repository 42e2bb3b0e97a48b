"""Every comparison of chapter 09 reduced to one row: the course's step beside the library's.

    row = side_by_side(ClusterRunner(c), "FSDP vs ZeRO-3", workers=4)
    row.equal, row.course_ms, row.library_ms, row.course_bytes, row.library_bytes

:data:`EXPERIMENTS` names each pair (the library's call and the course's chapter) and how
to run it with ``workers`` engines; :func:`side_by_side` runs one through its own
experiment function (each asserts nothing: the row says whether the two sides agreed
within that experiment's tolerance) and keeps:

- ``course_ms`` / ``library_ms``: the median time of a step on the slowest rank;
- ``course_bytes`` / ``library_bytes``: the bytes one rank sends per step, the mean over
  ranks and steps (the course's from its trace; torch's from the tensors its collectives
  or sends were given, under the ring rule 2(p-1)/p n for an allreduce);
- ``max_error`` within ``tolerance``: the largest difference of the two sides' parameters
  after any step (relative to the largest parameter where ``relative``).

The comparisons run torch with gloo on CPU float64 tensors, as the course computes
(:func:`coursekit.production.torch_group.process_group`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coursekit import checks

__all__ = ["EXPERIMENTS", "SideBySide", "side_by_side"]


@dataclass(frozen=True)
class SideBySide:
    """One comparison's row (see the module doc)."""

    experiment: str
    workers: int
    course_ms: float
    library_ms: float
    course_bytes: float
    library_bytes: float
    max_error: float
    tolerance: float
    relative: bool

    @property
    def equal(self) -> bool:
        """The two sides agreed after every step, within the tolerance."""
        return self.max_error <= self.tolerance

    def describe(self) -> str:
        """One line: agreement, time per step and bytes per rank of both sides."""
        kind = "relative " if self.relative else ""
        agreed = "equal" if self.equal else "NOT equal"
        return (f"{self.experiment} on {self.workers} engines: {agreed} within {kind}"
                f"{self.tolerance:.0e} (max {self.max_error:.1e}); per step course "
                f"{self.course_ms:.1f} ms, torch {self.library_ms:.1f} ms; bytes per rank "
                f"course {self.course_bytes / 1e3:,.1f} kB, torch {self.library_bytes / 1e3:,.1f} kB")


def _ddp(runner, workers: int) -> SideBySide:
    from .ddp import TOLERANCE, DDPConfig, ddp_experiment
    r = ddp_experiment(runner, DDPConfig(), workers=workers)
    course_s, ddp_s = r.time_per_step
    return SideBySide("DDP vs chapter 3's allreduce SGD", workers, course_s * 1e3, ddp_s * 1e3,
                      float(np.mean(r.course_sent)), float(np.mean(r.ddp_sent)),
                      float(r.max_diff.max()), TOLERANCE, relative=False)


def _zero(stage: int, name: str):
    def run(runner, workers: int) -> SideBySide:
        from .zero_fsdp import TOLERANCE, ZeroFsdpConfig, zero_experiment
        r = zero_experiment(runner, ZeroFsdpConfig(workers=workers, stage=stage))
        return SideBySide(name, workers, r.course_seconds * 1e3, r.torch_seconds * 1e3,
                          float(r.course_sent.mean()), float(r.torch_sent.mean()),
                          float(r.max_diff.max()), TOLERANCE, relative=False)
    return run


def _pipeline(schedule: str, name: str):
    def run(runner, workers: int) -> SideBySide:
        from .pipelining import RTOL, PipelineConfig, pipeline_experiment
        r = pipeline_experiment(runner, PipelineConfig(schedule=schedule, stages=workers))
        return SideBySide(name, workers, float(np.median(r.course_seconds)) * 1e3,
                          float(np.median(r.torch_seconds)) * 1e3, float(r.course_bytes.mean()),
                          float(r.torch_bytes.mean()),
                          float(max(r.param_error.max(), r.grad_error.max())), RTOL, relative=True)
    return run


def _powersgd(runner, workers: int) -> SideBySide:
    from .powersgd_hook import RTOL, PowerSGDConfig, powersgd_experiment
    r = powersgd_experiment(runner, PowerSGDConfig(workers=workers))
    return SideBySide("PowerSGD hook vs chapter 6's PowerSGD", workers,
                      float(np.median(r.course_seconds)) * 1e3,
                      float(np.median(r.torch_seconds)) * 1e3, float(r.course_wire.mean()),
                      float(r.ring_wire.mean()), float(r.param_error.max()), RTOL, relative=True)


EXPERIMENTS = {
    "DDP vs chapter 3's allreduce SGD": _ddp,
    "ZeroRedundancyOptimizer vs ZeRO-1": _zero(1, "ZeroRedundancyOptimizer vs ZeRO-1"),
    "FSDP (no reshard) vs ZeRO-2": _zero(2, "FSDP (no reshard) vs ZeRO-2"),
    "FSDP vs ZeRO-3": _zero(3, "FSDP vs ZeRO-3"),
    "pipelining GPipe vs chapter 5's": _pipeline("gpipe", "pipelining GPipe vs chapter 5's"),
    "pipelining 1F1B vs chapter 5's": _pipeline("1f1b", "pipelining 1F1B vs chapter 5's"),
    "PowerSGD hook vs chapter 6's PowerSGD": _powersgd,
}
"""The comparisons by name -> ``run(runner, workers) -> SideBySide``."""


def side_by_side(runner, experiment: str, workers: int) -> SideBySide:
    """Run the comparison ``experiment`` (a key of :data:`EXPERIMENTS`) on the first
    ``workers`` engines of ``runner`` and return its row."""
    if experiment not in EXPERIMENTS:
        raise ValueError(f"experiment={experiment!r}: allowed {list(EXPERIMENTS)}")
    checks.integer(workers, "workers", at_least=2, hint=" (engines: every comparison needs 2)")
    return EXPERIMENTS[experiment](runner, workers)
