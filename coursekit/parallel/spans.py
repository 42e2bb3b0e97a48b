"""What each rank did when: the one :class:`Span` type, compute and communication spans, and
the injected straggler.

A :class:`Span` ``(rank, kind, start, end, action)`` says that ``rank`` did ``kind`` from
``start`` to ``end``. Every part of the library that records or reads what ranks did uses
it: data-parallel SGD (:class:`SpanRecorder`, ``RankResult.spans`` / ``DPResult.spans``),
the parameter server's workers (``WorkerReport.spans``), the pipeline (``simulate(...)``
and ``run_pipeline(...)`` timelines), the simulator's replays (``Replay.spans``), and
whatever draws them (:func:`coursekit.viz.plot_timeline`, :mod:`coursekit.viz.pipeline`,
the panels). ``kind`` names the activity: "forward", "backward", "compute", "optimizer",
"comm", "send", "idle", "stage" (host <-> device copies around a GPU's compute; a
step on a GPU is t_compute + t_stage + t_comm) (colours from :mod:`coursekit.viz.style`).

A pipeline span also says which action it ran: its ``action`` is the schedule's
:class:`~coursekit.parallel.pipeline.Action` (kind, stage, micro-batch), and its ``kind``
is that action's kind, so ``kind`` is filled the same way everywhere (build one with
:meth:`Span.of_action`). Other spans leave ``action`` None. One optional field was chosen
over a second type or a "detail" string because the pipeline's readers need the stage and
the micro-batch as numbers (chunk shading, micro-batch labels, checking a timeline against
its schedule), and the Action already is the schedule's vocabulary; readers that only want
kinds and times treat every span alike. (One producer bends ``rank``: the simulated step of
:meth:`coursekit.sim.StepResult.spans`, where all workers are alike, puts a worker's compute
on row 0 and its allreduces on row 1.)

Times are on one clock per producer: data parallel and the pipeline's measured runs use the
message trace's (:func:`coursekit.comm.trace.now`), so spans and messages draw on one
timeline; parameter-server workers count seconds from the run's start; simulators count in
their own units.

Straggler injection: a recorder with ``slow_factor`` s > 1 stretches every compute span
to s times its measured length (it spins (s - 1) * t after each, keeping its core busy as
a slower processor does; sleeping would hand the core to the other engines when several
share few cores, and the step time would even fall). Synchronous SGD then
runs at the pace of the slowest worker: with one straggler the step time is about

    t_step ~ s * t_compute + t_comm        (the other N - 1 workers idle (s - 1) * t_compute)

because every gradient exchange waits for the last contribution.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, NamedTuple

import numpy as np

from coursekit.comm.trace import now

if TYPE_CHECKING:
    from coursekit.parallel.pipeline.actions import Action

__all__ = ["COMPUTE_KINDS", "STAGE_KINDS", "Span", "SpanRecorder", "step_totals"]

COMPUTE_KINDS = ("forward", "backward", "compute", "optimizer")
STAGE_KINDS = ("stage",)


class Span(NamedTuple):
    """``rank`` did ``kind`` from ``start`` to ``end``; ``action``: the pipeline action it
    ran, else None (see the module docstring)."""

    rank: int
    kind: str
    start: float
    end: float
    action: Action | None = None

    @property
    def duration(self) -> float:
        """end - start."""
        return self.end - self.start

    @classmethod
    def of_action(cls, rank: int, action: Action, start: float, end: float) -> Span:
        """The span of a pipeline ``action`` on ``rank``: its kind is the action's."""
        return cls(rank, action.kind, start, end, action)


class SpanRecorder:
    """Collects this rank's spans; compute spans are stretched by ``slow_factor``."""

    def __init__(self, rank: int, slow_factor: float = 1.0):
        if not slow_factor >= 1.0:
            raise ValueError(f"slow_factor must be >= 1 (1 = normal speed), got {slow_factor!r}")
        self.rank = rank
        self.slow_factor = float(slow_factor)
        self.spans: list[Span] = []

    def record(self, kind: str, t0: float, t1: float) -> None:
        """Add a span measured elsewhere (safe to call from another thread)."""
        self.spans.append(Span(self.rank, kind, t0, t1))

    @contextmanager
    def compute(self, kind: str = "compute"):
        """Time a compute block; a straggler spins (slow_factor - 1) times its length."""
        t0 = now()
        yield
        if self.slow_factor > 1.0:
            until = now() + (self.slow_factor - 1.0) * (now() - t0)
            while now() < until:  # busy, like a slower processor; sleep(0) lets in-process
                time.sleep(0)        # ranks (ThreadComm threads) take the GIL meanwhile
        self.record(kind, t0, now())

    @contextmanager
    def timed(self, kind: str):
        """Time a block as it is (not stretched): communication, staging."""
        t0 = now()
        yield
        self.record(kind, t0, now())

    def comm(self, kind: str = "comm"):
        """Time a communication block (including any wait for slower ranks)."""
        return self.timed(kind)

    def part(self, kind: str):
        """The block's timer by its kind: :meth:`compute` for :data:`COMPUTE_KINDS` (a
        straggler stretches them), :meth:`timed` for the others, e.g. "stage". Pass it as
        ``MLP.loss_and_grad(..., timer=recorder.part)``."""
        return self.compute(kind) if kind in COMPUTE_KINDS else self.timed(kind)

    def take(self) -> list[Span]:
        """The spans recorded so far (e.g. one step's), removed from the recorder."""
        spans, self.spans = self.spans, []
        return spans


def step_totals(spans, kinds) -> float:
    """Total duration of the spans whose kind is in ``kinds``: sum of end - start."""
    return float(np.sum([s.duration for s in spans if s.kind in kinds], dtype=float))
