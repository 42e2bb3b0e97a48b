"""Message tracing and the VERBOSE switch.

Every Comm keeps ``comm.trace``: a list of :class:`Message` records, one per user message
this rank sent or received (internal traffic such as ``barrier`` is not recorded).
``coursekit.viz`` draws them as a per-rank timeline and ``coursekit.costmodel`` counts
messages and bytes from them.

Clock: :func:`now` is ``time.monotonic()``, i.e. ``CLOCK_MONOTONIC`` on Linux (and the
system-wide monotonic clock on macOS and Windows). It is one clock for the whole machine,
so timestamps taken in different processes (engines, MPI ranks) on the same host are
directly comparable. Across hosts they are not: subtract a per-host offset first.
"""

from __future__ import annotations

import sys
import time
from typing import NamedTuple

now = time.monotonic


class Message(NamedTuple):
    """One traced message as seen by one rank.

    op: "send" or "recv"; src/dst: ranks; tag: user tag; nbytes: payload size in bytes
    (header excluded); t_start/t_end: :func:`now` when the call began and when it returned
    (for a send: when the message was handed to the transport, not when it arrived).
    """

    op: str
    src: int
    dst: int
    tag: int
    nbytes: int
    t_start: float
    t_end: float


_pkg = None


def verbose_enabled() -> bool:
    """Read ``coursekit.comm.VERBOSE`` at call time (so plain assignment works)."""
    global _pkg
    if _pkg is None:
        _pkg = sys.modules[__package__]
    return _pkg.VERBOSE


def describe(msg: Message, dtype, shape) -> str:
    """One line for the VERBOSE printout, e.g. ``[rank 0] send -> 1 tag=0 float32(4,) 16 B``."""
    if msg.op == "send":
        who, arrow, peer = msg.src, "->", msg.dst
    else:
        who, arrow, peer = msg.dst, "<-", msg.src
    micros = (msg.t_end - msg.t_start) * 1e6
    return (f"[rank {who}] {msg.op} {arrow} {peer} tag={msg.tag} "
            f"{dtype}{tuple(shape)} {msg.nbytes} B {micros:.0f} us")
