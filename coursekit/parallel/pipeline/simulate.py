"""Simulate a schedule: per-rank timeline, total time, bubble fraction, peak activations.

Times are per micro-batch through one rank's whole share of the model: F lasts ``t_f``,
B lasts ``t_b``, W lasts ``t_w`` (a chunk of an interleaved schedule with v chunks holds
1/v of the rank's layers and takes 1/v of that). In a schedule without W actions B is the
whole backward and lasts ``t_b + t_w``, so split and unsplit schedules do the same work;
with ``t_w = 0`` a split schedule's B is the whole backward (and W is free).
A message arrives ``p2p`` after it is sent; sends cost the sender nothing (buffered).

Definitions (p ranks, total time T = when the last rank finishes):

* ``bubble_fraction`` = idle / (p T) = 1 - (sum of busy compute time over ranks) / (p T).
  With p2p = 0 every rank idles (p-1)(t_f+t_b+t_w) in GPipe and 1F1B, so the fraction is
  (p-1)/(m+p-1); (p-1)(t_f+t_b+t_w)/v in interleaved 1F1B: (p-1)/(v m+p-1); and
  (p-1)(t_f+t_b-t_w) in ZB-H1 (t_w <= t_f): (p-1)/(3m+p-1) ~ (p-1)/(3m) when all are equal.
* ``peak_activations[r]`` = the largest number of micro-batches whose activations rank r
  holds at once: a micro-batch's activations on a stage are kept from its F until its
  backward is done (W when the backward is split, else B). A chunk of an interleaved
  schedule counts 1/v (it holds 1/v of the rank's layers), so the unit is "one
  micro-batch through all of this rank's layers": GPipe m, 1F1B p - r.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coursekit import checks

from .play import Span, play
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
    release = "W" if sched.split_backward else "B"
    peaks = np.zeros(sched.stages)
    for r in range(sched.stages):
        held = 0
        for a in sched.compute(r):
            held += (a.kind == "F") - (a.kind == release)
            peaks[r] = max(peaks[r], held)
    return peaks / sched.chunks


def simulate(schedule: Schedule, t_f: float = 1.0, t_b: float = 1.0, t_w: float = 0.0,
             p2p: float = 0.0) -> SimResult:
    """Play ``schedule`` (validated first) with the given action times; see the module doc."""
    t_f, t_b, t_w, p2p = (checks.real(value, name, at_least=0, hint=" (a time)") for name, value
                          in (("t_f", t_f), ("t_b", t_b), ("t_w", t_w), ("p2p", p2p)))
    if t_f + t_b + t_w == 0:
        raise ValueError("t_f, t_b and t_w are all 0: give the actions some duration")
    validate(schedule)
    v = schedule.chunks
    times = {"F": t_f / v, "B": (t_b if schedule.split_backward else t_b + t_w) / v, "W": t_w / v}
    timeline = play(schedule.actions, lambda a: times[a.kind], p2p)
    total = max(s.end for spans in timeline for s in spans)
    busy = np.array([sum(s.end - s.start for s in spans) for spans in timeline])
    return SimResult(schedule, timeline, total, float(1 - busy.sum() / (schedule.stages * total)),
                     peak_activations(schedule), busy)
