"""Checks for exercise 04: the SSP clock gate of the parameter server.

The student writes ``ssp_gate(clock, clocks, staleness) -> bool``: may a worker at
``clock`` proceed when the live workers' clocks are ``clocks`` (its own included)? The check

1. asks the gate about a table of small cases (the rule: ``clock - min(clocks) <= s``);
2. runs the real parameter server (ThreadComm ranks, random delays) with the student's gate
   and verifies that no applied gradient is staler than ``s`` (s = 1, 2, 3), that the
   slowest worker is never stopped (a deadlock is reported), and that ``s = 0`` gives
   exactly the weights of BSP (float64, bit for bit).
"""

from __future__ import annotations

import numpy as np

from coursekit.grading.core import CheckFailure, check

#: (clock, clocks of the live workers, staleness bound)
CASES = (
    (0, [0, 0, 0], 0), (1, [1, 0, 1], 0), (1, [1, 1, 1], 0), (3, [1, 3, 2], 1),
    (2, [1, 2, 2], 1), (5, [2, 5, 4], 3), (6, [2, 6], 3), (4, [4], 0), (7, [7, 9, 8], 0),
    (10, [0, 10], 9), (10, [1, 10], 9),
)
STALENESS = (1, 2, 3)
TIMEOUT = 10.0  # seconds any rank waits before a hang becomes an error
WORKERS = 3  # and one server shard


def _expected(clock, clocks, s) -> bool:
    return clock - min(clocks) <= s


def _ask(gate, clock, clocks, s) -> bool:
    answer = gate(clock, np.array(clocks, np.int64), s)
    if not isinstance(answer, (bool, np.bool_)):
        raise CheckFailure(f"ssp_gate must return True or False, got {answer!r} "
                           f"for clock={clock}, clocks={clocks}, staleness={s}")
    return bool(answer)


def _run(gate, **kwargs):
    from coursekit.data import load_digits
    from coursekit.parallel.param_server import PSConfig, train
    from coursekit.cluster.runner import LocalRunner

    config = PSConfig(steps=15, dtype="float64", timeout=TIMEOUT, **kwargs)
    try:
        return train(LocalRunner(1 + WORKERS), config, load_digits(dtype=np.float64),
                     workers=WORKERS, gate=gate)
    except RuntimeError as err:
        if "deadlock" in str(err):
            raise CheckFailure(f"with staleness={config.staleness} the run deadlocked: every "
                               "worker waited at your gate. The slowest worker (clock == min(clocks)) "
                               "must always be allowed to proceed.") from None
        raise


@check("ssp_gate")
def check_ssp_gate(gate):
    """``gate(clock, clocks, staleness) -> bool`` is SSP's rule, and the server runs with it."""
    for clock, clocks, s in CASES:
        got, want = _ask(gate, clock, clocks, s), _expected(clock, clocks, s)
        if got != want:
            lead = clock - min(clocks)
            raise CheckFailure(
                f"ssp_gate(clock={clock}, clocks={clocks}, staleness={s}) returned {got}: "
                f"the worker is {lead} clock(s) ahead of the slowest (clock {min(clocks)}), so it "
                f"{'may' if want else 'may not'} proceed with a bound of {s}")
    for s in STALENESS:
        result = _run(gate, model="ssp", staleness=s, jitter=0.002, straggler={2: 0.004})
        worst = int(result.staleness.max())
        if worst > s:
            raise CheckFailure(f"with staleness={s} a gradient was applied {worst} versions after "
                               "the weights it was computed on: the bound was exceeded")
    bsp = _run(None, model="bsp")
    ssp0 = _run(gate, model="ssp", staleness=0, jitter=0.002)
    if not np.array_equal(ssp0.params, bsp.params):
        raise CheckFailure("with staleness=0 the weights differ from BSP's: s = 0 must make every "
                           "worker wait until all others have pushed the previous iteration")
    return f"{len(CASES)} cases, no staleness above s = {STALENESS}, s = 0 equals BSP bit for bit"
