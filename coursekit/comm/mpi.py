"""MpiComm: the Comm protocol on mpi4py buffer calls, for engines launched with MPI.

Each message is one MPI message ``header + payload`` when the payload is at most
``frames.INLINE_MAX`` bytes, else two: the header, then the payload (zero-copy, straight
from the array into the receiver's buffer). MPI's own envelope does the source/tag
matching: ``recv`` starts a receive of the first part into a buffer that holds the longest
well-formed one (a persistent ``MPI_Recv_init`` kept per source and tag: 0.1 us less per
8 B one-way than an ``MPI_Irecv`` each time), then receives the payload, if any, from the
same source with the same tag; MPI's non-overtaking rule keeps them paired. (A matched probe,
``MPI_Improbe`` then ``MPI_Mrecv``, costs ~0.5 us more per message.) A wait that breaks
off cancels the posted receive, so no message is taken by a ``recv`` that gave up.

Traffic runs on a private duplicate of the given communicator, so it never mixes with the
program's own mpi4py messages. Constructing an MpiComm is therefore collective: every
rank of ``mpi_comm`` must construct one.

Waiting is a poll loop so every call honours the timeout: it spins on the MPI test for
the first 20 us (a few one-way latencies: MPI's own regime), then yields the CPU between
tests (``sched_yield``: a rank that shares its core with the peer it waits for lets that
peer run; spinning 100 us cost ~130 us per message there, 20 us ~45 us) and after 20 ms
sleeps with a back-off up to 1 ms, so a long wait costs little CPU and wakes at most
~1 ms late.

Sends never wait for the receiver to arrive. A plain ``send`` of a payload up to
``SYNC_MIN`` bytes copies it into a private buffer (one memcpy, like ``MPI_Bsend``) and
lets MPI finish in the background; up to ``frames.INLINE_MAX`` bytes that buffer, header
in front, is kept with a persistent send (``MPI_Send_init``) per destination and tag, and
reused by the next message of the same dtype and shape once MPI is done with it. From
``SYNC_MIN`` bytes on, the header goes by synchronous send (``MPI_Issend``, complete once
the receiver has matched it) and the copy is made in ``CHUNK``-byte pieces, testing that
header between pieces: when the receiver is already in ``recv`` it matches the header
while the first piece is copied, and the payload then goes straight from the caller's
array (``send`` returns when it has arrived: the receiver is taking it at that moment);
when it is not (it is busy, or it is sending to this rank at the same time), the copy
completes and ``send`` returns as before. So two ranks sending to each other at once
never deadlock, and a send costs at most what the copy cost before. ``sendrecv`` sends
from the caller's array without a copy and waits for it before returning.
Cost: alpha + n * beta (+ n / memcpy-bandwidth for a large plain ``send`` whose receiver
is not waiting yet).

If a rank dies, mpiexec usually ends the whole job; a survivor that is still alive gets
CommTimeout like on every other backend.
"""

from __future__ import annotations

import os
import time

import numpy as np

from . import frames
from .base import Comm, finish, recv_target
from .errors import ANY_SOURCE, ANY_TAG, CommError, CommTimeout
from .trace import now

_SPIN = 20e-6
_YIELD = 20e-3
_MAX_SLEEP = 1e-3
SYNC_MIN = 1 << 18
"""Plain sends of payloads from this many bytes try the zero-copy path (see above)."""
CHUNK = 1 << 18
"""Bytes copied between two tests of the header's synchronous send."""
_FIRST_MAX = frames.HEADER_MIN + 8 * frames.MAX_NDIM + frames.INLINE_MAX
"""Longest first part a well-formed message has (a header with an inline payload)."""
_CACHED_HEADERS = 1024
_CACHED_RECEIVES = 64
"""Persistent receives kept, one per (source, tag) a ``recv`` asked for (see ``_match``)."""
_CACHED_SENDS = 64
"""Persistent sends kept, one per (dest, tag) of an inline ``send`` (see ``_PersistentSend``)."""


def _bytes(arr: np.ndarray):
    from mpi4py import MPI
    return [memoryview(arr).cast("B"), MPI.BYTE]


class _PersistentSend:
    """An inline message (header + payload) in a buffer bound to a persistent send
    (``MPI_Send_init``): the next message to the same rank with the same tag, dtype and
    shape has the same header, so sending it copies its payload into ``payload`` and
    starts the request again, once the last one has completed. 0.2 us less per 8 B
    one-way than joining header and payload and posting an ``MPI_Isend`` each time."""

    __slots__ = ("request", "buffer", "payload", "dtype", "shape", "active")

    def __init__(self, data, buffer: bytearray, dest: int, tag: int, arr, header_size: int):
        self.request = data.Send_init(buffer, dest, tag)
        self.buffer = buffer
        self.payload = np.frombuffer(buffer, arr.dtype, arr.size, header_size).reshape(arr.shape)
        self.dtype, self.shape, self.active = arr.dtype, arr.shape, False

    def start(self, in_flight: list) -> None:
        """Send the buffer; until MPI is done with it, it stays in ``in_flight``."""
        self.request.Start()
        self.active = not self.request.Test()
        if self.active:
            in_flight.append((self.request, self.buffer))


class MpiComm(Comm):
    """One MPI rank (``mpi_comm`` defaults to ``MPI.COMM_WORLD``; construct on all ranks)."""

    def __init__(self, mpi_comm=None, *, timeout: float = 30.0, trace: bool = False):
        from mpi4py import MPI

        from .mpich_segments import forget_bootstrap_segments
        forget_bootstrap_segments()  # a rank killed by a signal leaves no file in /dev/shm
        self._MPI = MPI
        base = MPI.COMM_WORLD if mpi_comm is None else mpi_comm
        if not isinstance(base, MPI.Intracomm):
            raise TypeError(f"mpi_comm must be an mpi4py Intracomm, got {type(base).__name__}")
        self._data = base.Dup()
        self._sync = base.Dup()
        super().__init__(self._data.Get_rank(), self._data.Get_size(), timeout=timeout, trace=trace)
        self._in_flight: list = []  # (request, buffer) of sends MPI still owns
        self._status = MPI.Status()
        self._byte = MPI.BYTE
        self._any = (MPI.ANY_SOURCE, MPI.ANY_TAG)
        self._first = bytearray(_FIRST_MAX)  # every first part is received here, then copied out
        self._receives: dict = {}  # (source, tag) -> persistent receive into self._first
        self._sends: dict = {}  # (dest, tag) -> _PersistentSend of its last inline message
        self._headers: dict = {}  # header bytes -> (first part's length, (Header, payload))
        self._last_header = (b"-", -1, None)  # the last one: (its bytes, *its entry)

    def close(self) -> None:
        """Wait (at most ``timeout``) for buffered sends, then free the communicators."""
        if self.closed:
            return
        try:
            self._wait(self._flush, (), now() + self._timeout, ("close",), ANY_SOURCE, ANY_TAG)
        finally:
            self._free_receives()
            self._free_sends()
            super().close()
            self._data.Free()
            self._sync.Free()

    def barrier(self) -> None:
        """``MPI_Ibarrier`` polled until done: about ceil(log2 p) * alpha."""
        self._check_open()
        req = self._sync.Ibarrier()  # MPI cannot cancel it: after a timeout the comm is unusable
        with self.collective("barrier"):  # ... and says so (``broken``)
            self._wait(req.Test, (), now() + self._timeout, ("barrier",), ANY_SOURCE, ANY_TAG)

    def _flush(self) -> bool:
        self._in_flight = [(r, b) for r, b in self._in_flight if not r.Test()]
        return not self._in_flight

    def _wait(self, test, args, deadline, op, peer, tag):
        """Poll ``test(*args)`` until it returns something truthy; CommTimeout at the deadline."""
        start = now()
        pause = 20e-6
        while True:
            done = test(*args)
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

    def _keep(self, request, buf) -> None:
        """``buf`` stays alive until MPI is done with ``request``."""
        if not request.Test():
            self._in_flight.append((request, buf))

    def _post(self, dest, arr, tag, buffered):
        if self._in_flight:
            self._flush()
        if arr.nbytes <= frames.INLINE_MAX:
            send = self._sends.get((dest, tag))
            if send is not None and arr.dtype is send.dtype and arr.shape == send.shape and (
                    not send.active or send.request.Test()):
                send.payload[...] = arr  # the header in front of it is this message's
            else:
                send = self._new_send(dest, arr, tag, send)
                if send is None:
                    return None
            send.start(self._in_flight)
            return None
        data = self._data
        head = frames.encode(arr, tag, self.rank)
        if not buffered:
            self._keep(data.Isend(head, dest, tag), head)
            return data.Isend(_bytes(arr), dest, tag)
        if arr.nbytes < SYNC_MIN or dest == self.rank:
            self._keep(data.Isend(head, dest, tag), head)
            copy = arr.copy()
        else:
            matched = data.Issend(head, dest, tag)
            self._in_flight.append((matched, head))
            copy = self._copy_unless_matched(arr, matched)
            if copy is None:  # the receiver is in recv now: send from arr itself
                request = data.Isend(_bytes(arr), dest, tag)
                self._in_flight.append((request, arr))  # alive even if the wait breaks off
                self._wait(request.Test, (), now() + self._timeout, ("send", dest, tag),
                           dest, tag)
                self._in_flight.pop()
                return None
        self._keep(data.Isend(_bytes(copy), dest, tag), copy)
        return None

    def _new_send(self, dest, arr, tag, kept):
        """A persistent send of ``arr`` (header + payload, at most ``frames.INLINE_MAX``
        bytes of payload) to ``dest`` with ``tag``, kept in place of ``kept`` (that pair's
        last one, for another dtype or shape) for the next such send. While ``kept`` is
        still in flight its buffer cannot be rewritten: ``arr`` goes by ``MPI_Isend``
        instead, and None is returned."""
        head = frames.inline_header(arr, tag, self.rank)
        msg = bytearray(b"".join((head, arr)))  # header + payload in one copy
        if kept is not None and kept.active and not kept.request.Test():
            request = self._data.Isend(msg, dest, tag)
            if not request.Test():
                self._in_flight.append((request, msg))
            return None
        if kept is not None:
            kept.request.Free()
        elif len(self._sends) >= _CACHED_SENDS:
            self._free_sends(idle_only=True)
        send = self._sends[dest, tag] = _PersistentSend(self._data, msg, dest, tag, arr, len(head))
        return send

    def _free_sends(self, idle_only: bool = False) -> None:
        """Free the kept persistent sends (``idle_only``: those not in flight). A freed
        send still in flight completes in the background; its buffer stays in
        ``_in_flight`` until then."""
        for key, send in list(self._sends.items()):
            if not idle_only or not send.active or send.request.Test():
                send.request.Free()
                del self._sends[key]

    @staticmethod
    def _copy_unless_matched(arr, matched):
        """A private copy of ``arr``, or None as soon as ``matched`` (the header's
        synchronous send) completes: copied CHUNK bytes at a time, testing in between."""
        src = arr.reshape(-1).view(np.uint8)
        copy = np.empty_like(src)
        for lo in range(0, src.size, CHUNK):
            if matched.Test():
                return None
            copy[lo:lo + CHUNK] = src[lo:lo + CHUNK]
        return copy

    def _complete(self, request, dest, tag, deadline):
        if request is not None and not request.Test():
            self._wait(request.Test, (), deadline, ("send", dest, tag), dest, tag)

    def _match(self, source, tag, out, deadline, op):
        status = self._status
        src = self._any[0] if source == ANY_SOURCE else source
        tg = self._any[1] if tag == ANY_TAG else tag  # internal traffic uses another comm
        first = self._first
        request = self._receives.get((src, tg)) or self._persistent_receive(src, tg)
        request.Start()
        try:
            if not request.Test(status):
                self._wait_first(request, deadline, op, source, tag)
        except self._MPI.Exception as exc:  # longer than any well-formed first part
            raise CommError(f"rank {self.rank}: dropped a message from rank "
                            f"{status.Get_source()}: {exc.Get_error_string()} (a first part "
                            f"holds at most {_FIRST_MAX} bytes)") from None
        count = status.Get_count(self._byte)
        key, size, known = self._last_header
        header, payload = (known if first.startswith(key) and count == size  # _header's check
                           else self._header(first, count))
        if header.inline:  # payload: a view of it in self._first, to be copied out now
            if out is not None and out.dtype is header.dtype and out.shape == header.shape:
                out[...] = payload  # the common case, checked cheaply
                return header, out
            if out is None:
                return header, payload.copy()
            target = recv_target(header, out)  # raises ValueError when out does not fit
            np.copyto(target, payload)
            return header, finish(out, target)
        peer, ptag = status.Get_source(), status.Get_tag()
        try:
            target = recv_target(header, out)
        except ValueError:
            self._recv_payload(header, None, peer, ptag, deadline, op)  # drop it, then report
            raise
        return header, finish(out, self._recv_payload(header, target, peer, ptag, deadline, op))

    def _persistent_receive(self, src, tg):
        """A persistent receive (``MPI_Recv_init``) of a first part from ``src`` with tag
        ``tg`` into ``self._first``, kept for the next ``recv`` with the same pair: starting
        it costs ~0.2 us less than posting an ``MPI_Irecv`` when timed alone, 0.1 us of an
        8 B one-way (mpi4py builds the buffer and the request once). Every one is inactive
        between two ``recv`` calls (completed or cancelled), so one buffer serves them all."""
        if len(self._receives) >= _CACHED_RECEIVES:
            self._free_receives()
        request = self._receives[src, tg] = self._data.Recv_init(self._first, src, tg)
        return request

    def _free_receives(self) -> None:
        for request in self._receives.values():
            request.Free()
        self._receives.clear()

    def _wait_first(self, request, deadline, op, source, tag) -> None:
        """Wait for the posted receive of a first part. Broken off (timeout, interrupt), it
        is cancelled, so MPI never writes into ``self._first`` later; a message that
        arrived before the cancel took effect is kept: a timed-out wait returns normally
        with it (a poll never loses its message)."""
        status = self._status
        try:
            self._wait(request.Test, (status,), deadline, op, source, tag)
        except CommTimeout:
            if self._cancelled(request):
                raise
        except BaseException:
            self._cancelled(request)
            raise

    def _cancelled(self, request) -> bool:
        """Cancel a posted receive; False when a message completed it first."""
        request.Cancel()
        request.Wait(self._status)
        return self._status.Is_cancelled()

    def _header(self, first: bytearray, count: int):
        """(Header, inline payload or None) of a first part of ``count`` bytes; the payload
        is a view into ``self._first``. A header seen before is looked up (the last one
        first) and only the part's length checked again; a new one is decoded and checked
        in full (``frames.decode``)."""
        key, size, known = self._last_header
        if first.startswith(key) and count == size:
            return known
        entry = None
        if count >= frames.HEADER_MIN:
            key = bytes(first[:frames.HEADER_MIN + 8 * first[5]])
            entry = self._headers.get(key)
        if entry is None or count != entry[0]:
            header = self._decode(memoryview(first)[:count])  # a valid part fits self._first
            key = bytes(first[:header.size])
            payload = (np.frombuffer(first, header.dtype, header.nbytes // header.dtype.itemsize,
                                     header.size).reshape(header.shape)
                       if header.inline else None)
            entry = count, (header, payload)
            if len(self._headers) >= _CACHED_HEADERS:
                self._headers.clear()
            self._headers[key] = entry
        self._last_header = (key, *entry)
        return entry[1]

    def _recv_payload(self, header, target, peer, tag, deadline, op):
        buf = np.empty(header.shape, header.dtype) if target is None else target
        req = self._data.Irecv(_bytes(buf), peer, tag)
        try:
            if not req.Test():
                self._wait(req.Test, (), deadline, op, peer, tag)
        except self._MPI.Exception as exc:
            raise CommError(f"rank {self.rank}: bad payload from rank {peer}: {exc}") from None
        return buf
