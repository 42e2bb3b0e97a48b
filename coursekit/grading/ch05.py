"""Checks for exercise 05: the student's 1F1B (PipeDream-Flush) schedule generator.

The student writes ``one_f_one_b(stages, microbatches)`` returning, for every rank r, the
ordered list of compute actions ``F(r, i)`` / ``B(r, i)``. The check adds the sends and
receives (:meth:`Schedule.from_compute`), runs the validator (order, completeness,
deadlock) and the simulator, and compares with the 1F1B closed forms for p ranks and m
micro-batches: bubble fraction (p-1)/(m+p-1) and peak activations p - r on rank r
(GPipe has the same bubble but holds all m micro-batches).
"""

from __future__ import annotations

import numpy as np

from coursekit.grading.core import CheckFailure, check
from coursekit.parallel.pipeline import Schedule, ScheduleError, simulate

CASES = ((1, 1), (1, 3), (2, 2), (2, 5), (3, 4), (4, 4), (4, 8), (5, 11))
"""(stages p, microbatches m) pairs the check tries; m >= p as 1F1B requires."""


@check("one_f_one_b")
def check_one_f_one_b(fn, t_f: float = 1.0, t_b: float = 2.0):
    """``fn(stages, microbatches) -> [[F(r, i) / B(r, i) ...] for each rank r]``."""
    for p, m in CASES:
        case = f"for stages={p}, microbatches={m}"
        compute = fn(p, m)
        try:
            sched = Schedule.from_compute("your 1f1b", [list(acts) for acts in compute], m)
            result = simulate(sched, t_f=t_f, t_b=t_b)
        except ScheduleError as exc:
            raise CheckFailure(f"{case} the schedule is impossible: {exc}") from None
        except (TypeError, AttributeError, ValueError) as exc:
            raise CheckFailure(f"{case} return one list of F(stage, mb) / B(stage, mb) actions "
                               f"per rank ({exc})") from None
        if sched.split_backward:
            raise CheckFailure(f"{case} 1F1B has no W actions: B is the whole backward")
        want = (p - 1) / (m + p - 1)
        if not np.isclose(result.bubble_fraction, want):
            raise CheckFailure(f"{case} expected bubble fraction (p-1)/(m+p-1) = {want:.4f}, "
                               f"got {result.bubble_fraction:.4f}")
        peak = result.peak_activations
        expected = np.arange(p, 0, -1)
        if not np.array_equal(peak, expected):
            hint = " (that is GPipe's memory: start the backwards earlier)" if peak.max() == m > p else ""
            raise CheckFailure(f"{case} expected peak activations p - r = {expected.tolist()}, "
                               f"got {peak.astype(int).tolist()}{hint}")
    return (f"{len(CASES)} pipelines valid, bubble (p-1)/(m+p-1) and peak activations p - r "
            "on rank r")
