"""ThreadComm: n ranks as threads of one process, for tests, exercises and demos.

A send copies the array (that copy is the "transfer", cost ~ n / memcpy bandwidth) and
appends ``(header, copy)`` to the destination's inbox; the receiver decodes the header
exactly as a network backend would. All ranks of one world share an abort flag: when one
rank fails, ``run_local`` raises it and every blocked rank wakes up with a CommError
instead of waiting for its timeout.
"""

from __future__ import annotations

import threading
from collections import deque

from coursekit import checks

from . import frames
from .base import fill
from .errors import CommError
from .matching import QueuedComm
from .trace import now


class _World:
    """The shared state of n ThreadComm ranks: one inbox per rank and an abort flag."""

    def __init__(self, size: int):
        self.size = size
        self.inboxes = [deque() for _ in range(size)]
        self.conds = [threading.Condition() for _ in range(size)]
        self.abort_reason: str | None = None

    def deliver(self, dest: int, parts: tuple) -> None:
        with self.conds[dest]:
            self.inboxes[dest].append(parts)
            self.conds[dest].notify()

    def abort(self, reason: str) -> None:
        """Wake every blocked rank; their pending and future calls raise CommError."""
        self.abort_reason = reason
        for cond in self.conds:
            with cond:
                cond.notify_all()


class ThreadComm(QueuedComm):
    """One rank of an in-process world. Build a world with :meth:`world` or use
    :func:`coursekit.comm.run_local`. Traces like every backend: when asked (``trace=True``,
    ``comm.tracing = True`` or ``with trace.recording(comm)``), into a bounded
    :class:`~coursekit.comm.trace.Trace` (the newest ``trace.MAX_MESSAGES`` messages)."""

    def __init__(self, world: _World, rank: int, *, timeout: float = 30.0, trace: bool = False):
        super().__init__(rank, world.size, timeout=timeout, trace=trace)
        self._world = world
        self._payload_part = None

    @classmethod
    def world(cls, n: int, *, timeout: float = 30.0, trace: bool = False) -> list["ThreadComm"]:
        """``n`` connected ranks (use each from its own thread)."""
        n = checks.integer(n, "n", at_least=1, hint=" (the number of ranks: a positive int)")
        world = _World(n)
        return [cls(world, r, timeout=timeout, trace=trace) for r in range(n)]

    def abort(self, reason: str) -> None:
        """Abort the whole world (used by run_local when a rank fails)."""
        self._world.abort(reason)

    def _check_open(self) -> None:
        super()._check_open()
        if self._world.abort_reason is not None:
            raise CommError(f"rank {self.rank}: aborted: {self._world.abort_reason}")

    def _post(self, dest, arr, tag, buffered):
        self._world.deliver(dest, (frames.encode(arr, tag, self.rank), arr.copy()))

    def _complete(self, handle, dest, tag, deadline):
        pass

    def _next_header(self, deadline, op, peer, tag):
        inbox, cond = self._world.inboxes[self.rank], self._world.conds[self.rank]
        with cond:
            while not inbox:
                self._check_open()
                left = deadline - now()
                if left <= 0:
                    raise self._timeout_error(op, peer, tag)
                cond.wait(left)
            head, payload = inbox.popleft()
        header = self._decode(head)
        if header.inline == (payload is not None):
            raise CommError(f"rank {self.rank}: malformed message from rank {header.source}: "
                            "payload must be inline or a separate part, not both or neither")
        self._payload_part = payload
        return header, head

    def _read_payload(self, header, target):
        payload, self._payload_part = self._payload_part, None
        return fill(target, frames.to_array(header, payload))
