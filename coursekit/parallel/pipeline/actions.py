"""A pipeline schedule is data: per-rank ordered lists of :class:`Action`.

Compute actions (as in ``torch.distributed.pipelining``):

* ``F(s, i)``: forward of stage ``s`` on micro-batch ``i``;
* ``B(s, i)``: backward of stage ``s`` on micro-batch ``i``. In a schedule that has ``W``
  actions B is the input gradient only (dC/dA^{l-1} = delta^l W^l); otherwise it is the
  whole backward (input and weight gradients);
* ``W(s, i)``: the weight gradient (dC/dW^l = delta^T A^{l-1}, dC/db^l = sum delta).

Communication actions, present wherever consecutive stages sit on different ranks:

* ``SEND_F(s, i)`` after ``F(s, i)``: ship stage s's output to stage s+1;
  ``RECV_F(s, i)`` before ``F(s, i)``: receive stage s's input from stage s-1;
* ``SEND_B(s, i)`` after ``B(s, i)``: ship dC/d(input of s) to stage s-1;
  ``RECV_B(s, i)`` before ``B(s, i)``: receive dC/d(output of s) from stage s+1.

So ``SEND_F(s, i)`` matches ``RECV_F(s+1, i)`` and ``SEND_B(s, i)`` matches ``RECV_B(s-1, i)``.
"""

from __future__ import annotations

from typing import NamedTuple

COMPUTE = ("F", "B", "W")
COMM = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
KINDS = COMPUTE + COMM


class Action(NamedTuple):
    """One step of one rank: ``kind`` in :data:`KINDS`, ``stage``, ``mb`` (micro-batch)."""

    kind: str
    stage: int
    mb: int

    def __str__(self) -> str:  # F3.1 = forward of stage 3 on micro-batch 1
        return f"{self.kind}{self.stage}.{self.mb}"

    @property
    def is_compute(self) -> bool:
        return self.kind in COMPUTE

    def peer(self) -> "Action":
        """The matching action on the other side of a send/recv."""
        step = {"SEND_F": ("RECV_F", 1), "RECV_F": ("SEND_F", -1),
                "SEND_B": ("RECV_B", -1), "RECV_B": ("SEND_B", 1)}
        if self.kind not in step:
            raise ValueError(f"{self} is a compute action; only {', '.join(COMM)} have peers")
        kind, ds = step[self.kind]
        return Action(kind, self.stage + ds, self.mb)


def F(stage: int, mb: int) -> Action:  # noqa: N802 - the lecture's names
    """Forward of ``stage`` on micro-batch ``mb``."""
    return Action("F", stage, mb)


def B(stage: int, mb: int) -> Action:  # noqa: N802
    """Backward (input gradient, or whole backward if the schedule has no W) of ``stage``."""
    return Action("B", stage, mb)


def W(stage: int, mb: int) -> Action:  # noqa: N802
    """Weight gradient of ``stage`` on micro-batch ``mb``."""
    return Action("W", stage, mb)


def add_communication(compute: list[list[Action]], rank_of) -> list[list[Action]]:
    """Insert the sends/receives a compute-only schedule needs.

    ``rank_of(stage)`` gives the rank holding a stage (-1 / n_stages mean "none"). Every
    receive sits just before the action that consumes it and every send just after the
    action that produced it; sends are buffered (they return at once), receives block.
    """
    n_stages = 1 + max(a.stage for acts in compute for a in acts)
    out = []
    for rank, acts in enumerate(compute):
        lowered = []
        for a in acts:
            s, i = a.stage, a.mb
            remote_prev = s > 0 and rank_of(s - 1) != rank
            remote_next = s < n_stages - 1 and rank_of(s + 1) != rank
            if a.kind == "F":
                before, after = remote_prev * ["RECV_F"], remote_next * ["SEND_F"]
            elif a.kind == "B":
                before, after = remote_next * ["RECV_B"], remote_prev * ["SEND_B"]
            else:
                before, after = [], []
            lowered += [Action(k, s, i) for k in before] + [a] + [Action(k, s, i) for k in after]
        out.append(lowered)
    return out
