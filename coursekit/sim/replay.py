"""Discrete-event replay of per-rank programs (compute, send, recv) on a simulated network.

A program is what one rank does, in order: :class:`Compute` (busy for some seconds),
:class:`Send` (n bytes to a rank, with a tag) and :class:`Recv` (the next message from a
rank with a tag; messages with one (src, dst, tag) never overtake, as in the Comm
contract). :func:`programs_from_traces` turns the traces of a REAL run (``comm.trace`` of
every rank, e.g. a collective run on ThreadComm) into programs, so the simulator replays
exactly the messages the course's code sends.

Timing rules (Hockney's model, the one :mod:`coursekit.costmodel` uses):

* a send of n bytes from a to b holds a's outgoing link for ``alpha + n beta`` of the link
  (:meth:`Network.link`: intra- or inter-node) and arrives when it is over; the sending
  rank itself goes on at once (eager, buffered sends);
* a receive completes at ``max(now, arrival)``; a rank receives on all links at once;
* every rank has its own link: NIC sharing (``nics_per_node``) and incast are left to the
  closed forms of :mod:`.allreduce_time`; the reduction op is free here (``gamma`` unused).

Each event costs O(1), so a replay is O(total messages): fine for tens of ranks; for
thousands use the closed forms (a 2048-rank ring allreduce is 8 million messages).
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from coursekit import checks
from coursekit.parallel.spans import Span

from .network import Network

__all__ = ["Compute", "Deadlock", "Recv", "Replay", "Send", "programs_from_traces", "replay"]


class Compute(NamedTuple):
    seconds: float
    kind: str = "compute"


class Send(NamedTuple):
    dst: int
    nbytes: int
    tag: int = 0


class Recv(NamedTuple):
    src: int
    tag: int = 0


class Deadlock(ValueError):
    """The programs cannot finish: some rank waits for a message nobody sends."""


@dataclass(frozen=True)
class Replay:
    """Result of :func:`replay`: per-rank finish times and what happened when.

    ``spans``: :class:`~coursekit.parallel.spans.Span` s for compute, sends (link busy) and
    waits in recv, ready for :func:`coursekit.viz.plot_timeline` (``spans=``).
    """

    finish: np.ndarray
    spans: list

    @property
    def makespan(self) -> float:
        return float(self.finish.max()) if self.finish.size else 0.0


def programs_from_traces(traces) -> list[list]:
    """One program per rank from traced ``Message`` lists (sends and recvs, in order)."""
    programs = []
    for trace in traces:
        ops = []
        for m in trace:
            ops.append(Send(m.dst, m.nbytes, m.tag) if m.op == "send" else Recv(m.src, m.tag))
        programs.append(ops)
    return programs


def _check(programs, net: Network) -> None:
    checks.instance(net, "net", Network)
    if len(programs) != net.p:
        raise ValueError(f"{len(programs)} programs for a network of {net.p} ranks "
                         f"({net.nodes} nodes x {net.ranks_per_node})")
    for r, prog in enumerate(programs):
        for op in prog:
            if isinstance(op, Compute):
                checks.real(op.seconds, f"rank {r}: compute time", at_least=0)
                continue
            if not isinstance(op, (Send, Recv)):
                raise TypeError(f"rank {r}: unknown op {op!r}; use Compute, Send or Recv")
            peer = checks.integer(op.dst if isinstance(op, Send) else op.src,
                                  f"rank {r}: the other rank of {op!r}")
            if isinstance(op, Send):
                checks.integer(op.nbytes, f"rank {r}: nbytes of {op!r}", at_least=0)
            if not 0 <= peer < net.p or peer == r:
                raise ValueError(f"rank {r}: {op!r} names rank {peer}; allowed: other ranks "
                                 f"0..{net.p - 1}")


def replay(programs, net: Network) -> Replay:
    """Run every rank's program on ``net``; raise :class:`Deadlock` if they cannot finish."""
    _check(programs, net)
    p = net.p
    clock = np.zeros(p)
    port = np.zeros(p)  # when each rank's outgoing link is free again
    pc = [0] * p
    mail = defaultdict(deque)  # (src, dst, tag) -> arrival times
    waiting: dict[tuple, int] = {}  # mailbox key -> the rank blocked on it
    spans = []
    runnable = deque(range(p))
    while runnable:
        r = runnable.popleft()
        prog = programs[r]
        while pc[r] < len(prog):
            op = prog[pc[r]]
            if isinstance(op, Compute):
                spans.append(Span(r, op.kind, clock[r], clock[r] + op.seconds))
                clock[r] += op.seconds
            elif isinstance(op, Send):
                alpha, beta = net.link(r, op.dst)
                start = max(clock[r], port[r])
                port[r] = start + alpha + op.nbytes * beta
                spans.append(Span(r, "send", start, port[r]))
                key = (r, op.dst, op.tag)
                mail[key].append(port[r])
                if waiting.pop(key, None) is not None:
                    runnable.append(op.dst)
            else:
                key = (op.src, r, op.tag)
                if not mail[key]:
                    waiting[key] = r
                    break
                arrival = mail[key].popleft()
                if arrival > clock[r]:
                    spans.append(Span(r, "idle", clock[r], arrival))
                    clock[r] = arrival
            pc[r] += 1
    stuck = [r for r in range(p) if pc[r] < len(programs[r])]
    if stuck:
        detail = ", ".join(f"rank {r} waits in {programs[r][pc[r]]!r}" for r in stuck[:4])
        raise Deadlock(f"the programs deadlock: {detail}"
                       + (f" (and {len(stuck) - 4} more)" if len(stuck) > 4 else ""))
    return Replay(np.maximum(clock, port), spans)
