"""Reject impossible schedules before anything runs them, with a message that says why.

A valid schedule (see :mod:`.actions` for the action names) has, on the rank that holds
each stage s and for each micro-batch i:

* exactly one F(s, i) and one B(s, i); W(s, i) exactly once for every (s, i) or never;
* F(s, i) before B(s, i) before W(s, i) (a backward needs its forward's activations,
  a weight gradient needs B's delta);
* its input: RECV_F(s, i) before F(s, i) when stage s-1 is on another rank, else
  F(s-1, i) earlier on the same rank; likewise RECV_B(s, i) or B(s+1, i) before B(s, i);
* every receive has exactly one matching send on the peer's rank, after the action that
  produces the data, and vice versa;
* no deadlock when sends are buffered and receives block (:func:`.play.play`).
"""

from __future__ import annotations

from coursekit import checks

from .actions import COMM, KINDS, Action
from .play import Deadlock, play
from .schedule_type import Schedule


class ScheduleError(ValueError):
    """An impossible schedule."""


def validate(sched: Schedule) -> Schedule:
    """Return ``sched`` unchanged if it is possible, else raise :class:`ScheduleError`."""
    checks.instance(sched, "schedule", Schedule, " (e.g. from schedule(name, stages, "
                    "microbatches) or Schedule.from_compute)")
    p, m, n_stages = sched.stages, sched.microbatches, sched.n_stages
    if len(sched.actions) != p:
        raise ScheduleError(f"{sched.name}: {len(sched.actions)} action lists for {p} ranks; "
                            "give one list per rank")
    where: dict[Action, int] = {}  # action -> position on its rank
    for r, acts in enumerate(sched.actions):
        for k, a in enumerate(acts):
            if not isinstance(a, Action) or a.kind not in KINDS:
                raise ScheduleError(f"rank {r}, position {k}: {a!r} is not an Action with kind "
                                    f"in {KINDS}")
            if not (0 <= a.stage < n_stages and 0 <= a.mb < m):
                raise ScheduleError(f"rank {r}: {a} is out of range: stages 0..{n_stages - 1}, "
                                    f"micro-batches 0..{m - 1}")
            if sched.rank_of(a.stage) != r:
                raise ScheduleError(f"rank {r}: {a} belongs to stage {a.stage}, which lives on "
                                    f"rank {sched.rank_of(a.stage)} (stage s is on rank s % {p})")
            if a in where:
                raise ScheduleError(f"rank {r}: {a} appears twice; each action runs exactly once")
            where[a] = k
    kinds = ("F", "B", "W") if sched.split_backward else ("F", "B")
    for s in range(n_stages):
        for i in range(m):
            for kind in kinds:
                if Action(kind, s, i) not in where:
                    extra = " (the schedule has W actions, so every B needs its W)" * (kind == "W")
                    raise ScheduleError(f"rank {sched.rank_of(s)}: {kind}{s}.{i} is missing{extra}")
    for a, k in where.items():
        for before in _needs(a, sched):
            if before not in where:
                raise ScheduleError(f"rank {sched.rank_of(a.stage)}: {a} needs {before}, "
                                    "which no rank runs")
            if sched.rank_of(before.stage) == sched.rank_of(a.stage) and where[before] > k:
                raise ScheduleError(f"rank {sched.rank_of(a.stage)}: {a} (position {k}) comes "
                                    f"before {before} (position {where[before]}), which it needs")
    _check_pairs(where, sched)
    try:
        play(sched.actions, lambda a: 1.0)
    except Deadlock as exc:
        raise ScheduleError(f"{sched.name}: {exc}") from None
    return sched


def _needs(a: Action, sched: Schedule) -> list[Action]:
    """The actions that must happen before ``a`` (same rank: earlier in its list)."""
    s, i, last = a.stage, a.mb, sched.n_stages - 1
    remote_prev = s > 0 and sched.rank_of(s - 1) != sched.rank_of(s)
    remote_next = s < last and sched.rank_of(s + 1) != sched.rank_of(s)
    if a.kind == "F":
        return [] if s == 0 else [Action("RECV_F" if remote_prev else "F", s - (not remote_prev), i)]
    if a.kind == "B":
        after = [] if s == last else [Action("RECV_B" if remote_next else "B", s + (not remote_next), i)]
        return [Action("F", s, i)] + after
    if a.kind == "W":
        return [Action("B", s, i)]
    if a.kind == "SEND_F":
        return [Action("F", s, i)]
    if a.kind == "SEND_B":
        return [Action("B", s, i)]
    return []  # receives wait for their send: checked by _check_pairs and play


def _check_pairs(where: dict[Action, int], sched: Schedule) -> None:
    """Every send has exactly one receive on the peer's rank and vice versa."""
    comm = {a for a in where if a.kind in COMM}
    for a in comm:
        if a.peer() not in comm:
            verb = "a receive with no matching send" if a.kind.startswith("RECV") else \
                "a send that nobody receives"
            raise ScheduleError(f"rank {sched.rank_of(a.stage)}: {a} is {verb} "
                                f"(expected {a.peer()} on rank {sched.rank_of(a.peer().stage)})")
