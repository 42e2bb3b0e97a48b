"""Learning-rate rules for data-parallel SGD: how eta changes when the batch grows.

With N workers that each see n examples per step, the effective batch is n * N: the
summed-and-averaged gradient has about 1/N of the variance of one worker's, so SGD can
take larger steps. The lecture's advice ("no exact science: experiment") lists the rules:

================  ==========================================================================
rule              learning rate at step t (eta = ``base_lr``, tuned for one worker's batch n)
================  ==========================================================================
constant          eta                                  (ignore the bigger batch)
linear            eta * N                              (Krizhevsky 2014; Goyal et al. 2017)
sqrt              eta * sqrt(N)                        (keeps the update's variance constant)
linear_warmup     eta * (1 + (N - 1) * t / T_w)  for t < T_w, then eta * N
                                                       (Goyal et al. 2017, "gradual warmup":
                                                       start at the small-batch rate, ramp
                                                       linearly to eta * N over T_w steps)
================  ==========================================================================

``N`` here is the scale of the batch relative to the one ``base_lr`` was tuned for; in
:mod:`coursekit.parallel.data_parallel.sync_sgd` it is the number of workers.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from coursekit import checks

__all__ = ["RULES", "LRSchedule", "check_rule", "scaled_lr"]

RULES = ("constant", "linear", "sqrt", "linear_warmup")


def check_rule(rule) -> str:
    """``rule`` if it is one of :data:`RULES`, else a ValueError that lists them."""
    if not isinstance(rule, str) or rule not in RULES:
        raise ValueError(f"unknown learning-rate rule {rule!r}; allowed: {', '.join(RULES)}")
    return rule


def scaled_lr(base_lr: float, rule: str, n: float, step: int = 0, warmup_steps: int = 0) -> float:
    """The learning rate of ``rule`` at ``step`` for a batch ``n`` times the tuned one."""
    return LRSchedule(base_lr, rule, n, warmup_steps)(step)


@dataclass(frozen=True)
class LRSchedule:
    """``schedule(step)`` -> learning rate; see the module table for the rules.

    ``n`` is the batch scale (>= 1 in practice; any positive number is accepted);
    ``warmup_steps`` (T_w) only matters for ``"linear_warmup"``, where 0 means no ramp.
    """

    base_lr: float
    rule: str
    n: float
    warmup_steps: int = 0

    def __post_init__(self):
        checks.real(self.base_lr, "base_lr", above=0)
        check_rule(self.rule)
        checks.real(self.n, "n (the batch scale)", above=0)
        checks.integer(self.warmup_steps, "warmup_steps", at_least=0)

    @property
    def peak(self) -> float:
        """The rate after warmup (the only rate of the other rules)."""
        factor = {"constant": 1.0, "linear": self.n, "sqrt": math.sqrt(self.n),
                  "linear_warmup": self.n}[self.rule]
        return self.base_lr * factor

    def __call__(self, step: int) -> float:
        step = checks.integer(step, "step", at_least=0)
        if self.rule == "linear_warmup" and step < self.warmup_steps:
            return self.base_lr * (1 + (self.n - 1) * step / self.warmup_steps)
        return self.peak
