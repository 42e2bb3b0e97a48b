"""Play a schedule with buffered sends and blocking receives: the one semantics shared by
the deadlock check (:mod:`.validate`) and the simulator (:mod:`.simulate`).

Each rank runs its list in order. A compute action starts when the rank is free and lasts
``duration(action)``. A send costs the sender nothing (it is buffered, like ``Comm.send``)
and its message arrives ``p2p`` later. A receive blocks until its message has arrived.
If no rank can make progress before all are done, the schedule deadlocks.
"""

from __future__ import annotations

from typing import Callable

from ..spans import Span
from .actions import Action


class Deadlock(Exception):
    """Every unfinished rank waits for a message that is never sent; ``blocked`` says where."""

    def __init__(self, blocked: dict[int, Action]):
        self.blocked = blocked
        where = "; ".join(f"rank {r} waits at {a} for {a.peer()}" for r, a in blocked.items())
        super().__init__(f"deadlock: {where}")


def play(actions, duration: Callable[[Action], float], p2p: float = 0.0) -> list[list[Span]]:
    """Per-rank compute spans of ``actions`` (per-rank lists); raises :class:`Deadlock`."""
    n = len(actions)
    pos, clock = [0] * n, [0.0] * n
    arrival: dict[Action, float] = {}  # a RECV action -> when its message arrives
    spans: list[list[Span]] = [[] for _ in range(n)]
    progress = True
    while progress:
        progress = False
        for r in range(n):
            acts = actions[r]
            while pos[r] < len(acts):
                a = acts[pos[r]]
                if a.kind.startswith("RECV"):
                    if a not in arrival:
                        break
                    clock[r] = max(clock[r], arrival.pop(a))
                elif a.kind.startswith("SEND"):
                    arrival[a.peer()] = clock[r] + p2p
                else:
                    end = clock[r] + duration(a)
                    spans[r].append(Span.of_action(r, a, clock[r], end))
                    clock[r] = end
                pos[r] += 1
                progress = True
    blocked = {r: actions[r][pos[r]] for r in range(n) if pos[r] < len(actions[r])}
    if blocked:
        raise Deadlock(blocked)
    return spans
