"""What each rank did when: compute and communication spans, and the injected straggler.

A :class:`SpanRecorder` records ``(rank, kind, t_start, t_end)`` tuples on the same clock
as the message trace (:func:`coursekit.comm.trace.now`), so they draw on one timeline
with :func:`coursekit.viz.plot_timeline` (kinds: "forward", "backward", "compute",
"optimizer", "comm", "idle"; colours from :mod:`coursekit.viz.style`).

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

import numpy as np

from coursekit.comm.trace import now

__all__ = ["COMPUTE_KINDS", "SpanRecorder", "step_totals"]

COMPUTE_KINDS = ("forward", "backward", "compute", "optimizer")


class SpanRecorder:
    """Collects this rank's spans; compute spans are stretched by ``slow_factor``."""

    def __init__(self, rank: int, slow_factor: float = 1.0):
        if not slow_factor >= 1.0:
            raise ValueError(f"slow_factor must be >= 1 (1 = normal speed), got {slow_factor!r}")
        self.rank = rank
        self.slow_factor = float(slow_factor)
        self.spans: list[tuple] = []

    def record(self, kind: str, t0: float, t1: float) -> None:
        """Add a span measured elsewhere (safe to call from another thread)."""
        self.spans.append((self.rank, kind, t0, t1))

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
    def comm(self, kind: str = "comm"):
        """Time a communication block (including any wait for slower ranks)."""
        t0 = now()
        yield
        self.record(kind, t0, now())

    def take(self) -> list[tuple]:
        """The spans recorded so far (e.g. one step's), removed from the recorder."""
        spans, self.spans = self.spans, []
        return spans


def step_totals(spans, kinds) -> float:
    """Total seconds of the spans whose kind is in ``kinds``."""
    return float(np.sum([t1 - t0 for _, kind, t0, t1 in spans if kind in kinds], dtype=float))
