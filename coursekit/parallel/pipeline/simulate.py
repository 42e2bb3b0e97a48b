"""Simulate a schedule: per-rank timeline, total time, bubble fraction, peak activations.

Times are per micro-batch through one rank's whole share of the model, one per computation
(:func:`action_times`): F (forward) lasts ``t_f``, I (input gradient) ``t_i``, W (weight
gradient) ``t_w``, and B, the full backward, computes both:

    T_B = t_i + t_w

so a schedule that splits the backward into I and W and one that runs B do the same work.
A chunk of an interleaved schedule with v chunks holds 1/v of the rank's layers and takes
1/v of each time. A message arrives ``p2p`` after it is sent; sends cost the sender nothing
(buffered).

Definitions (p ranks, total time T = when the last rank finishes):

* ``bubble_fraction`` = idle / (p T) = 1 - (sum of busy compute time over ranks) / (p T).
  With p2p = 0 every rank idles (p-1)(t_f+t_i+t_w) in GPipe and 1F1B, so the fraction is
  (p-1)/(m+p-1); (p-1)(t_f+t_i+t_w)/v in interleaved 1F1B: (p-1)/(v m+p-1); and
  (p-1)(t_f+t_i-t_w) in ZB-H1 (t_w <= t_f): (p-1)/(3m+p-1) ~ (p-1)/(3m) when all are equal.
* ``peak_activations[r]`` = the largest number of micro-batches whose activations rank r
  holds at once: a micro-batch's activations on a stage are kept from its F until its
  backward is done (its B, or its W when it runs I then W). A chunk of an interleaved
  schedule counts 1/v (it holds 1/v of the rank's layers), so the unit is "one
  micro-batch through all of this rank's layers": GPipe m, 1F1B p - r.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coursekit import checks

from ..spans import Span
from .actions import BACKWARD_LAST
from .play import play
from .schedule_type import Schedule
from .validate import validate


@dataclass(frozen=True)
class SimResult:
    """What :func:`simulate` returns; ``timeline[r]`` is rank r's list of Spans."""

    schedule: Schedule
    timeline: list[list[Span]]
    total_time: float
    bubble_fraction: float
    peak_activations: np.ndarray
    busy: np.ndarray  # compute time per rank

    @property
    def idle(self) -> np.ndarray:
        """Idle (bubble) time per rank: total_time - busy."""
        return self.total_time - self.busy


def peak_activations(sched: Schedule) -> np.ndarray:
    """Peak in-flight micro-batch activations per rank (chunks count 1/v), from the order alone."""
    peaks = np.zeros(sched.stages)
    for r in range(sched.stages):
        held = 0
        for a in sched.compute(r):
            held += (a.kind == "F") - (a.kind in BACKWARD_LAST)
            peaks[r] = max(peaks[r], held)
    return peaks / sched.chunks


def action_times(t_f: float = 1.0, t_i: float = 1.0, t_w: float = 0.0,
                 chunks: int = 1) -> dict[str, float]:
    """The duration of every compute letter (times checked: finite, >= 0, not all 0):
    F ``t_f / v``, I ``t_i / v``, W ``t_w / v`` and B ``(t_i + t_w) / v`` (B = I + W),
    for v = ``chunks`` model chunks per rank."""
    t_f, t_i, t_w = (checks.real(value, name, at_least=0, hint=" (a time)") for name, value
                     in (("t_f", t_f), ("t_i", t_i), ("t_w", t_w)))
    if t_f + t_i + t_w == 0:
        raise ValueError("t_f, t_i and t_w are all 0: give the actions some duration")
    return {"F": t_f / chunks, "B": (t_i + t_w) / chunks, "I": t_i / chunks, "W": t_w / chunks}


def simulate(schedule: Schedule, t_f: float = 1.0, t_i: float = 1.0, t_w: float = 0.0,
             p2p: float = 0.0) -> SimResult:
    """Play ``schedule`` (validated first) with the times of F, I and W (B lasts
    ``t_i + t_w``); see the module doc."""
    p2p = checks.real(p2p, "p2p", at_least=0, hint=" (a time)")
    validate(schedule)
    times = action_times(t_f, t_i, t_w, schedule.chunks)
    timeline = play(schedule.actions, lambda a: times[a.kind], p2p)
    total = max(s.end for spans in timeline for s in spans)
    busy = np.array([sum(s.end - s.start for s in spans) for spans in timeline])
    return SimResult(schedule, timeline, total, float(1 - busy.sum() / (schedule.stages * total)),
                     peak_activations(schedule), busy)
