"""ZmqComm: point-to-point messages between processes over ZeroMQ (TCP).

Topology: every rank binds one PULL socket and connects one PUSH socket to every rank's
PULL (itself included), so the messages from one sender to one receiver travel over one
FIFO TCP stream (MPI's non-overtaking rule holds). ZeroMQ's I/O thread reads incoming
messages eagerly into an unbounded queue, so sends are buffered and two ranks may send
to each other at the same time without deadlock.

Setup is two-phase so any launcher can drive it (ipyparallel, multiprocessing, a shell)::

    ep = bind("127.0.0.1")               # phase 1, on every rank: bind, learn the address
    addresses = <gather ep.address from all ranks, in rank order>
    comm = ep.connect(rank, addresses, key=secret)   # phase 2: connect to everybody

Every message is authenticated with ``key``, a secret all ranks share (see
:mod:`coursekit.comm.auth`). A frame that fails (from a process without the key, a
replayed, truncated or misdirected one) is dropped where it is read and the receive goes
on waiting for the real message, so an intruder's frames cannot break a call off halfway
and leave its messages to the next one. ``comm.rejected`` counts the dropped frames,
``comm.last_rejected`` says why the last one was dropped and the address it came from,
and a CommTimeout names them too.

Floods: the PULL socket's receive queue is unbounded (RCVHWM = 0) on purpose. A finite
RCVHWM never drops on PULL: once a connection has that many unread messages, ZeroMQ stops
reading it and the sender waits (TCP back-pressure), so a rank's buffered zero-copy
``send`` would wait for its receiver, which the send contract above rules out. And it
would bound nothing: the HWM counts messages per connection, not bytes, while an intruder
picks the frame size and can open more connections. What holds instead
(``tests/comm/test_comm_flood.py``): frames queued while a rank computes cost their bytes
plus ZeroMQ's per-message overhead (100,000 frames of 100 bytes: ~31-36 MB, 310-360 B per
frame, on a 2-core machine), ZeroMQ fair-queues the connections so a legit message is read
past them, and a rank waiting in a receive drops them (~60 us per frame there). Keeping an
intruder out before any frame is queued needs authentication at connect (CURVE with a
ZAP handler), which would encrypt every message: not done.

Cost: payloads up to ``frames.INLINE_MAX`` bytes are copied into one message with the
header; larger C-contiguous arrays are sent zero-copy (``copy=False``): ``send`` returns
when ZeroMQ has written them to the kernel, i.e. t = alpha + n / bw with no extra memcpy.
A received large payload is returned without a copy (the array views ZeroMQ's buffer);
``recv(out=buf)`` receives straight into ``buf`` (one memcpy).

Single copy on one host: TCP over loopback still copies every byte twice (into the
kernel, out of it). Between ranks on one Linux host, ``sendrecv`` -- the step of every ring
and butterfly collective -- sends payloads of ``SINGLE_COPY_MIN`` bytes or more as a
REMOTE message instead: a 48-byte notice (header + pid, address, id) over TCP, after which
the receiver copies the array straight out of the sender's memory with
``process_vm_readv`` (:mod:`coursekit.comm.cma`, what MPICH calls CMA) and answers "done";
the sender's ``sendrecv`` returns after that answer, so its array is never reused early.
t = 2 alpha + n / bw_memcpy. At connect every pair checks that this works (each rank
reads a random token from the other's memory); where it does not (another host, another
OS, a forbidding kernel policy, ``single_copy=False``) messages go over TCP as above.
Plain ``send`` always goes over TCP: it is buffered and must not wait for the receiver.
"""

from __future__ import annotations

import math
import os

import numpy as np
import zmq

from coursekit import checks

from . import cma, frames
from .auth import FrameSealer, check_key
from .base import BARRIER_TAG
from .errors import CommError
from .matching import QueuedComm
from .trace import now

SINGLE_COPY_MIN = 1 << 18
"""``sendrecv`` payloads from this many bytes go by single copy between ranks on one host."""

HELLO_TAG = BARRIER_TAG + 64  # internal tags above the barrier's rounds (< 64 of them)
VERDICT_TAG = HELLO_TAG + 1
DONE_TAG = HELLO_TAG + 2
WHO_TAG = HELLO_TAG + 3


class Endpoint:
    """Phase 1: a bound PULL socket whose ``address`` the launcher hands to every rank."""

    def __init__(self, interface: str = "127.0.0.1"):
        if not isinstance(interface, str) or not interface:
            raise TypeError(f"interface must be an IP address or interface name, got {interface!r}")
        if interface in ("*", "0.0.0.0", "::"):
            raise ValueError(f"interface {interface!r} is a wildcard; give an address the "
                             "other ranks can reach, e.g. '127.0.0.1' or 'eth0'")
        self._ctx = zmq.Context(io_threads=1)
        self._pull = self._ctx.socket(zmq.PULL)
        self._pull.setsockopt(zmq.RCVHWM, 0)
        self._pull.setsockopt(zmq.LINGER, 0)
        try:
            self._pull.bind(f"tcp://{interface}:0")
        except zmq.ZMQError as exc:
            self.close()
            raise ValueError(f"cannot bind to interface {interface!r}: {exc}") from None
        self.address: str = self._pull.get(zmq.LAST_ENDPOINT).decode()

    def connect(self, rank: int, addresses: list[str], *, key: bytes, timeout: float = 30.0,
                trace: bool = False, single_copy: bool = True) -> "ZmqComm":
        """Phase 2: connect to every rank's address (``addresses[rank]`` must be ours).

        Every rank must call it (it exchanges a handshake with every other rank), with the
        same ``key`` (bytes, at least 16: the secret that authenticates every frame).
        ``single_copy=False`` keeps this rank's messages on TCP (see the module doc).
        """
        if not isinstance(addresses, (list, tuple)) or not all(isinstance(a, str) for a in addresses):
            raise TypeError("addresses must be a list of address strings, one per rank")
        if not (isinstance(rank, int) and 0 <= rank < len(addresses)):
            raise ValueError(f"rank must be in 0..{len(addresses) - 1}, got {rank!r}")
        checks.boolean(trace, "trace")
        checks.boolean(single_copy, "single_copy")
        if addresses[rank] != self.address:
            raise ValueError(f"addresses[{rank}] is {addresses[rank]!r} but this endpoint is bound "
                             f"to {self.address!r}: the list must be in rank order")
        return ZmqComm(self, rank, list(addresses), key=check_key(key), timeout=timeout,
                       trace=trace, single_copy=single_copy)

    def close(self) -> None:
        self._pull.close(0)
        self._ctx.term()


def bind(interface: str = "127.0.0.1") -> Endpoint:
    """Phase 1 of the setup: bind a receiving socket on ``interface`` (see module doc)."""
    return Endpoint(interface)


class ZmqComm(QueuedComm):
    """One rank talking to the others over ZeroMQ; build it with ``bind(...).connect(...)``."""

    def __init__(self, endpoint: Endpoint, rank: int, addresses: list[str], *, key: bytes,
                 timeout: float = 30.0, trace: bool = False, single_copy: bool = True):
        super().__init__(rank, len(addresses), timeout=timeout, trace=trace)
        self._sealer = FrameSealer(key, rank, len(addresses))
        self.addresses = addresses
        self._endpoint = endpoint
        self._pull = endpoint._pull
        self._rcvtimeo_full = None  # the timeout RCVTIMEO was last set to, None if shortened
        self._push = []
        for address in addresses:
            sock = endpoint._ctx.socket(zmq.PUSH)
            sock.setsockopt(zmq.SNDHWM, 0)
            sock.connect(address)
            self._push.append(sock)
        self._pid = os.getpid()
        self._readers: frozenset = frozenset()  # ranks that can copy from our memory
        self._peer_pid: dict[int, int] = {}     # ranks whose memory we can copy from
        self._sent = 0                          # id of the last REMOTE message sent
        self._in_flight: dict[int, np.ndarray] = {}  # REMOTE arrays not yet copied: kept alive
        self.rejected = 0                       # frames dropped: they failed authentication
        self.last_rejected: str | None = None   # why the last one was dropped, and its sender
        if self.size > 1:
            try:
                self._handshake(single_copy and cma.supported())
            except BaseException:
                self.close(linger=0)
                raise

    def _handshake(self, enabled: bool) -> None:
        """Find the peers that can copy from our memory and those we can copy from.

        First every rank tells the others its pid and host identity, and lets the peers on
        its host read its memory (``cma.allow_readers``: their common ancestor and its
        descendants only). Then each rank offers (pid, address of a random 16-byte token);
        a peer that reads the token back through ``process_vm_readv`` may use single copy.
        """
        deadline, others = now() + self._timeout, [r for r in range(self.size) if r != self.rank]
        enabled = self._allow_local_readers(others, enabled, deadline)
        token = np.frombuffer(os.urandom(16), np.uint64).copy()  # alive until every verdict
        offer = np.array([self._pid, token.ctypes.data, *token] if enabled else [0] * 4, np.uint64)
        for peer in others:
            self._post(peer, offer, HELLO_TAG, True)
        for peer in others:
            pid, address, *expected = self._match(peer, HELLO_TAG, None, deadline, ("connect",))[1]
            readable = enabled and pid != 0 and _token_readable(int(pid), int(address), expected)
            if readable:  # accept its REMOTE messages before it can send one (our verdict)
                self._peer_pid[peer] = int(pid)
                self._remote_peers = frozenset(self._peer_pid)
            self._post(peer, np.array([readable], np.uint8), VERDICT_TAG, True)
        self._readers = frozenset(
            peer for peer in others
            if self._match(peer, VERDICT_TAG, None, deadline, ("connect",))[1][0])

    def _allow_local_readers(self, others, enabled: bool, deadline) -> bool:
        """Exchange (pid, host identity) (zeros when single copy is off here); grant the
        same-host peers read access. False when off, when no peer shares this host, or when
        they share only init (then nothing is granted)."""
        me = np.array([self._pid, *cma.host_identity()] if enabled else [0] * 3, np.uint64)
        for peer in others:
            self._post(peer, me, WHO_TAG, True)
        local = []
        for peer in others:
            pid, *identity = self._match(peer, WHO_TAG, None, deadline, ("connect",))[1].tolist()
            if enabled and identity == me[1:].tolist() and 0 not in identity:
                local.append(pid)
        return bool(local) and cma.allow_readers(self, local) is not None

    @property
    def single_copy_peers(self) -> frozenset:
        """Ranks this rank sends large ``sendrecv`` payloads to by single copy."""
        return self._readers

    def close(self, linger: float | None = None) -> None:
        """Close the sockets; queued outgoing messages get ``linger`` seconds (default: timeout)."""
        if self.closed:
            return
        super().close()
        self._in_flight.clear()
        cma.withdraw_readers(self)
        ms = int(1000 * (self._timeout if linger is None else linger))
        for sock in self._push:
            sock.close(ms)
        self._endpoint.close()

    def _post(self, dest, arr, tag, buffered):
        sock, seal = self._push[dest], self._sealer.seal
        if arr.nbytes <= frames.INLINE_MAX:
            sock.send(seal(frames.encode(arr, tag, self.rank, inline=True), dest), copy=True)
            return None
        if not buffered and arr.nbytes >= SINGLE_COPY_MIN and dest in self._readers:
            self._sent += 1
            self._in_flight[self._sent] = arr
            sock.send(seal(frames.encode_remote(arr, tag, self.rank, self._pid, self._sent), dest),
                      copy=True)
            return self._sent
        sock.send(seal(frames.encode(arr, tag, self.rank), dest), zmq.SNDMORE)
        tracker = sock.send(arr, copy=False, track=True)
        if buffered:
            self._complete(tracker, dest, tag, now() + self._timeout)
            return None
        return tracker

    def _complete(self, tracker, dest, tag, deadline):
        if tracker is None:
            return
        if isinstance(tracker, int):  # a REMOTE message: wait until the receiver copied it
            self._await_copied(tracker, dest, tag, deadline)
            return
        try:
            tracker.wait(max(deadline - now(), 0.0))
        except zmq.NotDone:
            raise self._timeout_error(("send", dest, tag), dest, tag) from None

    def _await_copied(self, message_id, dest, tag, deadline):
        """Read incoming messages (keeping them for later recvs) until ``message_id`` is done.

        A timeout leaves the array in ``_in_flight``: the receiver may still read it.
        """
        while message_id in self._in_flight:
            header, head = self._read_header(deadline, ("send", dest, tag), dest, tag)
            if header.tag == DONE_TAG:
                self._note_done(header, head)
            else:
                self._unmatched.append((header, self._park(header, head)))

    def _note_done(self, header, head) -> None:
        if header.source not in self._readers or header.shape != (1,) or header.dtype != np.uint64:
            raise CommError(f"rank {self.rank}: dropped a malformed 'copied' notice from rank "
                            f"{header.source}")
        self._in_flight.pop(int(frames.to_array(header, head, header.size)[0]), None)

    def _next_header(self, deadline, op, peer, tag):
        """The next message for matching; 'copied' notices are noted on the way."""
        while True:
            header, head = self._read_header(deadline, op, peer, tag)
            if header.tag != DONE_TAG:
                return header, head
            self._note_done(header, head)

    def _park(self, header, head):
        """A single-copy message nobody asked for yet stays in its sender's memory: it is
        copied once, straight into the ``out`` of the ``recv`` that takes it (copying it now
        into a fresh array, then into ``out``, held up to one message per step a faster
        peer ran ahead: allreduce peaks of ~2x the array against the model's 1.25x, issue
        29). The sender waits for the copy as if the notice had come later; MPI's
        rendezvous sends do the same."""
        return head if header.remote else super()._park(header, head)

    def _unpark(self, header, parked, target):
        if header.remote:
            return self._payload(header, parked, target)
        return super()._unpark(header, parked, target)

    def _payload(self, header, head, target):
        if not header.remote:
            return super()._payload(header, head, target)
        pid, address, message_id = frames.descriptor(header, head)
        source = header.source
        try:
            if pid != self._peer_pid[source]:
                raise CommError(f"rank {self.rank}: dropped a message from rank {source}: it "
                                f"points into process {pid}, not rank {source}'s process")
            arr = np.empty(header.shape, header.dtype) if target is None else target
            try:
                cma.read_into(pid, address, arr)
            except OSError as exc:
                raise CommError(f"rank {self.rank}: could not copy a message out of rank "
                                f"{source}'s memory: {exc}") from None
        finally:  # the sender waits for this notice, whatever happened here
            self._post(source, np.array([message_id], np.uint64), DONE_TAG, True)
        return arr

    def _read_header(self, deadline, op, peer, tag):
        sock = self._pull
        if self._rcvtimeo_full != self._timeout:
            # the first wait may take the whole timeout: the call began microseconds ago
            self._set_rcvtimeo(min(math.ceil(self._timeout * 1000), 2**31 - 1))
            self._rcvtimeo_full = self._timeout
        while True:
            try:
                head = sock.recv(copy=False)
            except zmq.Again:
                left = deadline - now()
                if left <= 0:
                    raise self._timeout_error(op, peer, tag) from None
                self._set_rcvtimeo(math.ceil(left * 1000))
                self._rcvtimeo_full = None
                continue
            more = head.more
            try:
                head = self._sealer.open(head, head.get("Peer-Address") or "an unknown address")
                break
            except CommError as exc:  # not this comm's: changes nothing, so wait on
                self._drain(more)
                self.rejected += 1
                self.last_rejected = str(exc)
        try:
            header = self._decode(head)
        except CommError:
            self._drain(more)
            raise
        if more == (header.inline or header.remote):
            self._drain(more)
            raise CommError(f"rank {self.rank}: dropped a message from rank {header.source}: "
                            "it must be one inline or remote part, or header + payload parts")
        return header, head

    def _timeout_error(self, op, peer, tag):
        """The base class's CommTimeout, saying what this rank dropped meanwhile (an
        intruder's frames cost time, not correctness: a flood can still make a call late)."""
        exc = super()._timeout_error(op, peer, tag)
        if self.rejected:
            exc.args = (f"{exc.args[0]}; this comm has dropped {self.rejected} frame(s) that "
                        f"failed authentication, the last: {self.last_rejected}",)
        return exc

    def _set_rcvtimeo(self, ms: int) -> None:
        """A blocking recv on the PULL socket waits at most ``ms`` milliseconds."""
        self._pull.setsockopt(zmq.RCVTIMEO, ms)

    def _read_payload(self, header, target):
        sock = self._pull
        if target is None:
            part = sock.recv(copy=False)
            nbytes, more = len(part), part.more
        else:
            nbytes = sock.recv_into(memoryview(target).cast("B"))
            more = sock.getsockopt(zmq.RCVMORE)
        if more or nbytes != header.nbytes:
            self._drain(more)
            frames.check_payload(header, nbytes)
            raise CommError(f"rank {self.rank}: dropped a message from rank {header.source}: "
                            "extra parts after the payload")
        return target if target is not None else frames.to_array(header, part)

    def _drain(self, more: bool) -> None:
        while more:
            more = self._pull.recv(copy=False).more


def _token_readable(pid: int, address: int, expected) -> bool:
    """True when process ``pid`` holds the 16-byte ``expected`` token at ``address``."""
    probe = np.empty(2, np.uint64)
    try:
        cma.read_into(pid, address, probe)
    except OSError:
        return False
    return probe.tolist() == [int(e) for e in expected]
