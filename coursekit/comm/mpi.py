"""MpiComm: the Comm protocol on mpi4py buffer calls, for engines launched with MPI.

Each message is one MPI message ``header + payload`` when the payload is at most
``frames.INLINE_MAX`` bytes, else two: the header, then the payload (zero-copy, straight
from the array into the receiver's buffer). MPI's own envelope does the source/tag
matching: ``recv`` matched-probes (``MPI_Improbe``) a header, then receives the payload
from the same source with the same tag; MPI's non-overtaking rule keeps them paired.

Traffic runs on a private duplicate of the given communicator, so it never mixes with the
program's own mpi4py messages. Constructing an MpiComm is therefore collective: every
rank of ``mpi_comm`` must construct one.

Waiting is a poll loop so every call honours the timeout: it spins on the MPI test for
the first 100 us (MPI's own latency regime), then yields the CPU between tests
(``sched_yield``: other ranks on the same cores can run) and after 20 ms sleeps with a
back-off up to 1 ms, so a long wait costs little CPU and wakes at most ~1 ms late. Sends never block: a plain ``send`` copies payloads above INLINE_MAX into a
private buffer (one memcpy, like ``MPI_Bsend``) and lets MPI finish in the background;
``sendrecv`` sends from the caller's array without a copy and waits for it before
returning. Cost: alpha + n * beta (+ n / memcpy-bandwidth for a large plain ``send``).

If a rank dies, mpiexec usually ends the whole job; a survivor that is still alive gets
CommTimeout like on every other backend.
"""

from __future__ import annotations

import os
import time

import numpy as np

from . import frames
from .base import Comm, fill, finish, recv_target
from .errors import ANY_SOURCE, ANY_TAG, CommError
from .trace import now

_SPIN = 100e-6
_YIELD = 20e-3
_MAX_SLEEP = 1e-3


def _bytes(arr: np.ndarray):
    from mpi4py import MPI
    return [memoryview(arr).cast("B"), MPI.BYTE]


class MpiComm(Comm):
    """One MPI rank (``mpi_comm`` defaults to ``MPI.COMM_WORLD``; construct on all ranks)."""

    def __init__(self, mpi_comm=None, *, timeout: float = 30.0, trace: bool = False):
        from mpi4py import MPI
        self._MPI = MPI
        base = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        if not isinstance(base, MPI.Intracomm):
            raise TypeError(f"mpi_comm must be an mpi4py Intracomm, got {type(base).__name__}")
        self._data = base.Dup()
        self._sync = base.Dup()
        super().__init__(self._data.Get_rank(), self._data.Get_size(), timeout=timeout, trace=trace)
        self._in_flight: list = []  # (request, buffer) of buffered sends MPI still owns
        self._status = MPI.Status()

    def close(self) -> None:
        """Wait (at most ``timeout``) for buffered sends, then free the communicators."""
        if self.closed:
            return
        try:
            self._wait(self._flush, now() + self._timeout, ("close",), ANY_SOURCE, ANY_TAG)
        finally:
            super().close()
            self._data.Free()
            self._sync.Free()

    def barrier(self) -> None:
        """``MPI_Ibarrier`` polled until done: about ceil(log2 p) * alpha."""
        self._check_open()
        req = self._sync.Ibarrier()  # MPI cannot cancel it: after a timeout the comm is unusable
        with self.collective("barrier"):  # ... and says so (``broken``)
            self._wait(req.Test, now() + self._timeout, ("barrier",), ANY_SOURCE, ANY_TAG)

    def _flush(self) -> bool:
        self._in_flight = [(r, b) for r, b in self._in_flight if not r.Test()]
        return not self._in_flight

    def _wait(self, test, deadline, op, peer, tag):
        """Poll ``test()`` until it returns something truthy; CommTimeout at the deadline."""
        start = now()
        pause = 20e-6
        while True:
            done = test()
            if done:
                return done
            waited = now() - start
            if start + waited > deadline:
                raise self._timeout_error(op, peer, tag)
            if waited > _YIELD:
                time.sleep(pause)
                pause = min(pause * 2, _MAX_SLEEP)
            elif waited > _SPIN:
                os.sched_yield()

    def _post(self, dest, arr, tag, buffered):
        self._flush()
        isend = self._data.Isend
        if arr.nbytes <= frames.INLINE_MAX:
            msg = frames.encode(arr, tag, self.rank, inline=True)
            self._in_flight.append((isend([msg, self._MPI.BYTE], dest, tag), msg))
            return None
        head = frames.encode(arr, tag, self.rank)
        self._in_flight.append((isend([head, self._MPI.BYTE], dest, tag), head))
        if buffered:
            arr = arr.copy()
            self._in_flight.append((isend(_bytes(arr), dest, tag), arr))
            return None
        return isend(_bytes(arr), dest, tag)

    def _complete(self, request, dest, tag, deadline):
        if request is not None:
            self._wait(request.Test, deadline, ("send", dest, tag), dest, tag)

    def _match(self, source, tag, out, deadline, op):
        MPI, status = self._MPI, self._status
        src = MPI.ANY_SOURCE if source == ANY_SOURCE else source
        tg = MPI.ANY_TAG if tag == ANY_TAG else tag  # internal traffic uses another comm
        message = self._wait(lambda: self._data.Improbe(src, tg, status), deadline, op, source, tag)
        head = bytearray(status.Get_count(MPI.BYTE))
        message.Recv([head, MPI.BYTE])
        peer, ptag = status.Get_source(), status.Get_tag()
        header = self._decode(head)
        if header.inline:
            inline = frames.to_array(header, head, header.size)
            return header, finish(out, fill(recv_target(header, out), inline))
        try:
            target = recv_target(header, out)
        except ValueError:
            self._recv_payload(header, None, peer, ptag, deadline, op)  # drop it, then report
            raise
        return header, finish(out, self._recv_payload(header, target, peer, ptag, deadline, op))

    def _recv_payload(self, header, target, peer, tag, deadline, op):
        buf = np.empty(header.shape, header.dtype) if target is None else target
        req = self._data.Irecv(_bytes(buf), peer, tag)
        try:
            self._wait(req.Test, deadline, op, peer, tag)
        except self._MPI.Exception as exc:
            raise CommError(f"rank {self.rank}: bad payload from rank {peer}: {exc}") from None
        return buf

