"""A pipeline schedule is data: per-rank ordered lists of :class:`Action`.

Every compute action says what it computes by itself (the letters of
``torch.distributed.pipelining``'s ``_ComputationType``), whatever else the schedule holds.
For stage ``s`` on micro-batch ``i`` (layers compute Z^l = A^{l-1} W^l + b^l, A^l = sigma(Z^l),
delta^l = dC/dZ^l):

* ``F(s, i)``: the forward, A^l of the stage's layers;
* ``B(s, i)``: the full backward, input and weight gradients in one action:
  dC/dA^{l-1} = delta^l (W^l)^T, dC/dW^l = (A^{l-1})^T delta^l, dC/db^l = sum delta^l;
* ``I(s, i)``: the input gradient only, dC/dA^{l-1} = delta^l (W^l)^T (what the previous
  stage waits for; it keeps delta^l for W);
* ``W(s, i)``: the weight gradient only, dC/dW^l = (A^{l-1})^T delta^l, dC/db^l = sum delta^l
  (nothing waits for it: zero-bubble schedules use it to fill the holes).

So B = I + W: a micro-batch's backward on a stage is either one ``B`` or one ``I`` and,
later, one ``W`` (:mod:`.validate` enforces it).

Communication actions, present wherever consecutive stages sit on different ranks:

* ``SEND_F(s, i)`` after ``F(s, i)``: ship stage s's output to stage s+1;
  ``RECV_F(s, i)`` before ``F(s, i)``: receive stage s's input from stage s-1;
* ``SEND_B(s, i)`` after ``B(s, i)`` or ``I(s, i)``: ship dC/d(input of s) to stage s-1;
  ``RECV_B(s, i)`` before ``B(s, i)`` or ``I(s, i)``: receive dC/d(output of s) from stage
  s+1 (the ``_B`` is the backward direction, as in PyTorch).

So ``SEND_F(s, i)`` matches ``RECV_F(s+1, i)`` and ``SEND_B(s, i)`` matches ``RECV_B(s-1, i)``.
"""

from __future__ import annotations

from typing import NamedTuple

MEANING = {"F": "forward",
            "B": "full backward: input and weight gradient",
            "I": "input gradient only",
            "W": "weight gradient only"}
"""Compute letter -> what the action computes."""
COMPUTE = tuple(MEANING)  # F, B, I, W
COMM = ("SEND_F", "RECV_F", "SEND_B", "RECV_B")
KINDS = COMPUTE + COMM
BACKWARD_INPUT = ("B", "I")
"""The actions that produce dC/d(input of the stage), i.e. what the previous stage waits for."""
BACKWARD_LAST = ("B", "W")
"""The actions that end a micro-batch's backward on a stage (its activations can go)."""


def allowed_kinds() -> str:
    """The allowed action kinds and what each computes, for error messages."""
    letters = ", ".join(f"{k} ({what})" for k, what in MEANING.items())
    return f"compute actions {letters}; communication {', '.join(COMM)}"


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
    """Full backward (input and weight gradient) of ``stage`` on micro-batch ``mb``."""
    return Action("B", stage, mb)


def I(stage: int, mb: int) -> Action:  # noqa: E743, N802
    """Input gradient only of ``stage`` on micro-batch ``mb`` (its W comes later)."""
    return Action("I", stage, mb)


def W(stage: int, mb: int) -> Action:  # noqa: N802
    """Weight gradient only of ``stage`` on micro-batch ``mb`` (after its I)."""
    return Action("W", stage, mb)


def add_communication(compute: list[list[Action]], rank_of) -> list[list[Action]]:
    """Insert the sends/receives a compute-only schedule needs.

    ``rank_of(stage)`` gives the rank holding a stage (-1 / n_stages mean "none"). Every
    receive sits just before the action that consumes it and every send just after the
    action that produced it; sends are buffered (they return at once), receives block.
    Each message is added once, even where a (wrong) schedule computes its data twice (B
    and I of one micro-batch), so that :func:`.validate.validate` names the compute actions.
    """
    n_stages = 1 + max(a.stage for acts in compute for a in acts)
    out = []
    for rank, acts in enumerate(compute):
        lowered, added = [], set()

        def once(kinds, s, i):
            new = [Action(k, s, i) for k in kinds if Action(k, s, i) not in added]
            added.update(new)
            return new

        for a in acts:
            s, i = a.stage, a.mb
            remote_prev = s > 0 and rank_of(s - 1) != rank
            remote_next = s < n_stages - 1 and rank_of(s + 1) != rank
            if a.kind == "F":
                before, after = remote_prev * ["RECV_F"], remote_next * ["SEND_F"]
            elif a.kind in BACKWARD_INPUT:
                before, after = remote_next * ["RECV_B"], remote_prev * ["SEND_B"]
            else:
                before, after = [], []
            lowered += once(before, s, i) + [a] + once(after, s, i)
        out.append(lowered)
    return out
