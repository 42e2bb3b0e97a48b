"""Checks for exercise 05: the student's 1F1B (PipeDream-Flush) schedule generator.

The student writes ``one_f_one_b(stages, microbatches)`` returning, for every rank r, the
ordered list of compute actions ``F(r, i)`` (forward) / ``B(r, i)`` (full backward: input
and weight gradient); any other letter fails with the letters 1F1B allows and what each
computes (I and W, the halves of a split backward, belong to zero-bubble schedules). The
check adds the sends and receives (:meth:`Schedule.from_compute`), runs the validator
(order, completeness, deadlock) and the simulator, and compares with the 1F1B closed forms
for p ranks and m micro-batches: bubble fraction (p-1)/(m+p-1) and peak activations p - r
on rank r (GPipe has the same bubble but holds all m micro-batches).
"""

from __future__ import annotations

import numpy as np

from coursekit.grading.core import CheckFailure, check
from coursekit.parallel.pipeline import MEANING, Action, Schedule, ScheduleError, simulate

CASES = ((1, 1), (1, 3), (2, 2), (2, 5), (3, 4), (4, 4), (4, 8), (5, 11))
"""(stages p, microbatches m) pairs the check tries; m >= p as 1F1B requires."""
LETTERS = ("F", "B")
"""The compute letters of a 1F1B schedule (each micro-batch's backward is one B)."""


def _check_letters(compute, case: str) -> None:
    """CheckFailure naming the first action whose letter 1F1B does not use."""
    for a in (a for acts in compute for a in acts):
        if isinstance(a, Action) and a.kind not in LETTERS:
            allowed = " and ".join(f"{k} ({MEANING[k]})" for k in LETTERS)
            hint = ("; I then W split the backward, as zero-bubble schedules do"
                    if a.kind in {"I", "W"} else "")
            raise CheckFailure(f"{case} {a} has the letter {a.kind!r} "
                               f"({MEANING.get(a.kind, 'no action has it')}); 1F1B uses only "
                               f"{allowed}{hint}")


@check("one_f_one_b")
def check_one_f_one_b(fn, t_f: float = 1.0, t_i: float = 1.0, t_w: float = 1.0):
    """``fn(stages, microbatches) -> [[F(r, i) / B(r, i) ...] for each rank r]``; simulated
    with times ``t_f``, ``t_i``, ``t_w`` (B = I + W lasts ``t_i + t_w``)."""
    for p, m in CASES:
        case = f"for stages={p}, microbatches={m}"
        compute = fn(p, m)
        try:
            compute = [list(acts) for acts in compute]
            _check_letters(compute, case)
            sched = Schedule.from_compute("your 1f1b", compute, m)
            result = simulate(sched, t_f=t_f, t_i=t_i, t_w=t_w)
        except ScheduleError as exc:
            raise CheckFailure(f"{case} the schedule is impossible: {exc}") from None
        except (TypeError, AttributeError, ValueError) as exc:
            raise CheckFailure(f"{case} return one list of F(stage, mb) / B(stage, mb) actions "
                               f"per rank ({exc})") from None
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
