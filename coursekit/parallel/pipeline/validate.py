"""Reject impossible schedules before anything runs them, with a message that says why.

A valid schedule (see :mod:`.actions` for what each letter computes) has, on the rank that
holds each stage s and for each micro-batch i:

* exactly one F(s, i);
* one backward: either exactly one B(s, i) (input and weight gradient), or exactly one
  I(s, i) (input gradient) and one W(s, i) (weight gradient), never B with I or W;
  schedules may mix the two forms across micro-batches and stages;
* F(s, i) before B(s, i) or I(s, i) (a backward needs its forward's activations), and
  I(s, i) before W(s, i) (W needs the delta that I computed);
* its input: RECV_F(s, i) before F(s, i) when stage s-1 is on another rank, else
  F(s-1, i) earlier on the same rank; likewise RECV_B(s, i), or the B / I of (s+1, i),
  before B(s, i) or I(s, i);
* every receive has exactly one matching send on the peer's rank, after the action that
  produces the data, and vice versa;
* no deadlock when sends are buffered and receives block (:func:`.play.play`).
"""

from __future__ import annotations

from coursekit import checks

from .actions import BACKWARD_INPUT, COMM, COMPUTE, KINDS, Action, allowed_kinds
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
            if not isinstance(a, Action):
                raise ScheduleError(f"rank {r}, position {k}: {a!r} is not an Action (build "
                                    "them with F(s, i), B(s, i), I(s, i) and W(s, i))")
            if a.kind not in KINDS:
                raise ScheduleError(f"rank {r}, position {k}: {a} has the unknown kind "
                                    f"{a.kind!r}; allowed: {allowed_kinds()}")
            if not (0 <= a.stage < n_stages and 0 <= a.mb < m):
                raise ScheduleError(f"rank {r}: {a} is out of range: stages 0..{n_stages - 1}, "
                                    f"micro-batches 0..{m - 1}")
            if sched.rank_of(a.stage) != r:
                raise ScheduleError(f"rank {r}: {a} belongs to stage {a.stage}, which lives on "
                                    f"rank {sched.rank_of(a.stage)} (stage s is on rank s % {p})")
            if a in where:
                raise ScheduleError(f"rank {r}: {a} appears twice; each action runs exactly once")
            where[a] = k
    for s in range(n_stages):
        for i in range(m):
            _check_computes(s, i, where, sched)
    for a, k in where.items():
        for before in _needs(a, sched, where):
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


def _check_computes(s: int, i: int, where: dict[Action, int], sched: Schedule) -> None:
    """Stage ``s`` runs micro-batch ``i``'s forward once and its backward as B or as I + W."""
    have = {kind for kind in COMPUTE if Action(kind, s, i) in where}
    at, mb = f"rank {sched.rank_of(s)}: ", f"{s}.{i}"
    forms = ("one B (input and weight gradient), or one I (input gradient) then one W "
             "(weight gradient)")
    if "F" not in have:
        raise ScheduleError(f"{at}F{mb} is missing (the forward of stage {s} on micro-batch {i})")
    if "B" in have and have & {"I", "W"}:
        halves = " and ".join(k + mb for k in ("I", "W") if k in have)
        raise ScheduleError(f"{at}B{mb} computes the whole backward of stage {s} on micro-batch "
                            f"{i}, so {halves} must not be there too: it is {forms}, not both")
    if have == {"F", "I"}:
        raise ScheduleError(f"{at}I{mb} has no W{mb}: the weight gradient of stage {s} on "
                            f"micro-batch {i} is never computed; add W{mb} after I{mb}, or use "
                            f"B{mb} for the whole backward")
    if have == {"F", "W"}:
        raise ScheduleError(f"{at}W{mb} has no I{mb}: the input gradient of stage {s} on "
                            f"micro-batch {i} is never computed; add I{mb} before W{mb}, or use "
                            f"B{mb} for the whole backward")
    if have == {"F"}:
        raise ScheduleError(f"{at}B{mb} is missing: the backward of stage {s} on micro-batch "
                            f"{i} is {forms}")


def _input_grad(s: int, i: int, where: dict[Action, int]) -> Action:
    """The action computing stage ``s``'s input gradient for micro-batch ``i``: I, else B."""
    return Action("I", s, i) if Action("I", s, i) in where else Action("B", s, i)


def _needs(a: Action, sched: Schedule, where: dict[Action, int]) -> list[Action]:
    """The actions that must happen before ``a`` (same rank: earlier in its list)."""
    s, i, last = a.stage, a.mb, sched.n_stages - 1
    remote_prev = s > 0 and sched.rank_of(s - 1) != sched.rank_of(s)
    remote_next = s < last and sched.rank_of(s + 1) != sched.rank_of(s)
    if a.kind == "F":
        return [] if s == 0 else [Action("RECV_F" if remote_prev else "F", s - (not remote_prev), i)]
    if a.kind in BACKWARD_INPUT:
        if s == last:
            return [Action("F", s, i)]
        grad_in = Action("RECV_B", s, i) if remote_next else _input_grad(s + 1, i, where)
        return [Action("F", s, i), grad_in]
    if a.kind == "W":
        return [Action("I", s, i)]
    if a.kind == "SEND_F":
        return [Action("F", s, i)]
    if a.kind == "SEND_B":
        return [_input_grad(s, i, where)]
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
