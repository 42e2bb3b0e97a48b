"""Message tracing and the VERBOSE switch.

Every Comm keeps ``comm.trace``: a list of :class:`Message` records, one per user message
this rank sent or received (internal traffic such as ``barrier`` is not recorded).
``coursekit.viz`` draws them as a per-rank timeline and ``coursekit.costmodel`` counts
messages and bytes from them. Every comm's trace is a bounded :class:`Trace` (the newest
:data:`MAX_MESSAGES`, with a count of the dropped ones): a long traced run must not grow
without bound (~40 MB per 100k messages per rank otherwise). Every backend traces only
when asked: ``trace=True``, ``comm.tracing = True`` or :func:`recording`.

Clock: :func:`now` is ``time.monotonic()``, i.e. ``CLOCK_MONOTONIC`` on Linux (and the
system-wide monotonic clock on macOS and Windows). It is one clock for the whole machine,
so timestamps taken in different processes (engines, MPI ranks) on the same host are
directly comparable. Across hosts they are not: subtract a per-host offset first.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
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


def describe(msg: Message, dtype, shape) -> str:
    """One line for the VERBOSE printout, e.g. ``[rank 0] send -> 1 tag=0 float32(4,) 16 B``."""
    if msg.op == "send":
        who, arrow, peer = msg.src, "->", msg.dst
    else:
        who, arrow, peer = msg.dst, "<-", msg.src
    micros = (msg.t_end - msg.t_start) * 1e6
    return (f"[rank {who}] {msg.op} {arrow} {peer} tag={msg.tag} "
            f"{dtype}{tuple(shape)} {msg.nbytes} B {micros:.0f} us")


MAX_MESSAGES = 100_000
"""How many messages a comm's trace keeps by default (:class:`Trace`): ~20 MB per rank.

A traced Message costs ~200 bytes, so an unbounded trace grows ~40 MB per 100k messages a
rank sends with ``sendrecv`` (one send + one recv record each). Timelines and cost-model
checks look at a few collectives, far fewer messages. Change this before the comms are
built (``coursekit.comm.trace.MAX_MESSAGES = ...``), or give one comm its own trace:
``comm.trace = Trace(maxlen=None)`` (unbounded) or ``Trace(maxlen=10**6)``."""

_DEFAULT = object()


class Trace(list):
    """A list of :class:`Message` that keeps only the newest ``maxlen`` (a ring buffer).

    It is a ``list`` in every other respect (index, slice, ``del``, ``clear``, iterate,
    pickle), so code written for ``comm.trace`` as a list keeps working. When an append
    would make it longer than ``maxlen``, the oldest quarter is dropped at once (appending
    stays O(1) amortized), so a full trace holds between 3/4 ``maxlen`` and ``maxlen`` of
    the newest messages. ``dropped`` counts the messages dropped so far and ``total`` all
    messages ever recorded, so a timeline can say "the last ``len(trace)`` of ``total``
    messages". ``clear()`` empties it and resets ``dropped``.

    Dropping shifts indices: a position remembered as ``len(trace)`` is stale after a
    drop. Remember ``trace.total`` instead and read the messages recorded since with
    ``trace.since(total)``. ``maxlen=None`` never drops; the default is
    :data:`MAX_MESSAGES` at the time the trace is made.
    """

    maxlen: int | None = None  # class defaults: unpickling appends before it sets attributes
    dropped: int = 0

    def __init__(self, iterable=(), maxlen=_DEFAULT):
        if maxlen is _DEFAULT:
            maxlen = MAX_MESSAGES
        if maxlen is not None and (isinstance(maxlen, bool) or not isinstance(maxlen, int)
                                   or maxlen < 1):
            raise ValueError(f"maxlen must be a positive int or None (unbounded), got {maxlen!r}")
        super().__init__()
        self.maxlen = maxlen
        self.dropped = 0
        self.extend(iterable)

    @property
    def total(self) -> int:
        """Messages recorded since the trace was made or last cleared, dropped ones included."""
        return self.dropped + len(self)

    def since(self, total: int) -> list:
        """The messages recorded after ``trace.total`` was ``total`` (those not dropped)."""
        return list.__getitem__(self, slice(max(total - self.dropped, 0), None))

    def forget_since(self, total: int) -> None:
        """Remove the messages recorded after ``trace.total`` was ``total``."""
        del self[max(total - self.dropped, 0):]

    def _trim(self) -> None:
        if self.maxlen is not None and len(self) > self.maxlen:
            drop = len(self) - self.maxlen + self.maxlen // 4
            del self[:drop]
            self.dropped += drop

    def append(self, msg) -> None:
        list.append(self, msg)
        if self.maxlen is not None and len(self) > self.maxlen:
            self._trim()

    def extend(self, items) -> None:
        list.extend(self, items)
        self._trim()

    def insert(self, index, msg) -> None:
        list.insert(self, index, msg)
        self._trim()

    def __iadd__(self, items):
        list.extend(self, items)
        self._trim()
        return self

    def __setitem__(self, index, value) -> None:
        list.__setitem__(self, index, value)
        self._trim()

    def clear(self) -> None:
        list.clear(self)
        self.dropped = 0


@contextmanager
def recording(comm):
    """Trace ``comm`` inside the ``with`` block, whatever its tracing setting; yields a
    function that returns the messages recorded since the block began. Afterwards tracing
    is as it was, and a comm that was not tracing keeps none of the block's messages."""
    was_tracing, mark = comm.tracing, comm.trace.total
    comm.tracing = True
    try:
        yield lambda: comm.trace.since(mark)
    finally:
        comm.tracing = was_tracing
        if not was_tracing:
            comm.trace.forget_since(mark)
