"""Replay a chapter-5 pipeline schedule on the simulator's two-level network.

:func:`coursekit.parallel.pipeline.simulate` plays a :class:`~coursekit.parallel.pipeline.Schedule`
with one fixed cost ``p2p`` per message. Here the same schedule becomes per-rank programs
for :func:`coursekit.sim.replay` (the event-level replay of :mod:`.replay`): compute actions
become :class:`~.replay.Compute` with the durations :func:`simulate` uses
(:func:`~coursekit.parallel.pipeline.simulate.action_times`: F ``t_f/v``, I ``t_i/v``,
W ``t_w/v``, B = I + W ``(t_i + t_w)/v``), and every
``SEND_F`` / ``SEND_B`` / ``RECV_F`` / ``RECV_B`` becomes a :class:`~.replay.Send` /
:class:`~.replay.Recv` of ``activation_bytes`` between the ranks holding the two stages. A
message then costs ``alpha + n beta`` of the link it crosses (inside a node or between nodes,
:meth:`Network.link`) and occupies the sender's outgoing link, so stages placed on
different nodes pay for it. With negligible links the replay gives :func:`simulate`'s
total time at ``p2p = 0`` (tested).

Every message gets its own tag, ``(direction, sending stage, micro-batch)``, so receives
match their sends whatever the order.
"""

from __future__ import annotations

from dataclasses import dataclass

from coursekit import checks
from coursekit.parallel.pipeline import Schedule, validate
from coursekit.parallel.pipeline.simulate import action_times
from coursekit.parallel.spans import step_totals

from .network import Network
from .replay import Compute, Recv, Replay, Send, replay

__all__ = ["PipelineReplay", "programs_from_schedule", "replay_schedule"]

# each letter's coursekit.viz colour
_KIND = {"F": "forward", "B": "backward", "I": "input_grad", "W": "weight_grad"}


def _tag(direction: int, sender_stage: int, mb: int, sched: Schedule) -> int:
    return (direction * sched.n_stages + sender_stage) * sched.microbatches + mb


def programs_from_schedule(sched: Schedule, t_f: float = 1.0, t_i: float = 1.0,
                           t_w: float = 0.0, activation_bytes: int = 0) -> list[list]:
    """One replay program per pipeline rank (the schedule is validated first)."""
    n = checks.integer(activation_bytes, "activation_bytes", at_least=0)
    validate(sched)
    seconds = action_times(t_f, t_i, t_w, sched.chunks)
    programs = []
    for acts in sched.actions:
        ops = []
        for a in acts:
            s, i = a.stage, a.mb
            if a.is_compute:
                ops.append(Compute(seconds[a.kind], _KIND[a.kind]))
            elif a.kind == "SEND_F":
                ops.append(Send(sched.rank_of(s + 1), n, _tag(0, s, i, sched)))
            elif a.kind == "RECV_F":
                ops.append(Recv(sched.rank_of(s - 1), _tag(0, s - 1, i, sched)))
            elif a.kind == "SEND_B":
                ops.append(Send(sched.rank_of(s - 1), n, _tag(1, s, i, sched)))
            else:  # RECV_B
                ops.append(Recv(sched.rank_of(s + 1), _tag(1, s + 1, i, sched)))
        programs.append(ops)
    return programs


@dataclass(frozen=True)
class PipelineReplay:
    """``total_time``: when the last rank (or its last message) is done; ``bubble_fraction``
    = 1 - compute / (p x total_time), as in :class:`~coursekit.parallel.pipeline.SimResult`;
    ``replay``: the full :class:`~.replay.Replay` (spans for a timeline)."""

    total_time: float
    bubble_fraction: float
    replay: Replay


def replay_schedule(sched: Schedule, net: Network, t_f: float = 1.0, t_i: float = 1.0,
                    t_w: float = 0.0, activation_bytes: int = 0) -> PipelineReplay:
    """Replay ``sched`` on ``net`` (one network rank per pipeline rank, node-major); times
    as in :func:`~coursekit.parallel.pipeline.simulate` (B lasts ``t_i + t_w``)."""
    checks.instance(sched, "sched", Schedule)
    checks.instance(net, "net", Network)
    if net.p != sched.stages:
        raise ValueError(f"the schedule has {sched.stages} pipeline ranks but the network has "
                         f"{net.p} ({net.nodes} nodes x {net.ranks_per_node}); they must match")
    result = replay(programs_from_schedule(sched, t_f, t_i, t_w, activation_bytes), net)
    total = result.makespan
    busy = step_totals(result.spans, _KIND.values())
    bubble = 1 - busy / (sched.stages * total) if total > 0 else 0.0
    return PipelineReplay(total, float(bubble), result)
