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
Plain ``send`` goes over TCP (buffered: it never waits for the receiver) unless the
receiver has a shared-memory lane from this rank (below).

Shared-memory lanes on one host (:mod:`coursekit.comm.shm`, on by default,
``shared_memory=False`` to measure TCP instead): after the single-copy check, every pair of
same-host ranks for which single copy works both ways maps a ring of each other's segment
(and every rank one to itself), and from then on every message between them goes through
it; TCP is left for ranks on other hosts. Payloads up to ``shm.RECORD_MAX`` bytes are
copied into the ring and out of it (t = alpha_shm + 2n / bw_memcpy, alpha_shm a few
microseconds); larger ones as REMOTE records by single copy (t = alpha_shm + n /
bw_memcpy), for plain ``send`` too: the receiver copies a plain send's array as soon as it
reads the notice, in any call of its own, and a sender whose receiver does not start within
``shm.CLAIM_GRACE_S`` (it computes) takes the notice back and sends a copy of its own
instead (:meth:`ZmqComm._send_eager`), so a plain ``send`` still never waits for its
receiver. Lane records are not sealed: only processes of the same user (those that may
read the ranks' memory anyway) can open a segment. A rank waiting on a lane peer whose
process has ended (an engine killed, a crash) says so within ``shm.PEER_CHECK_S``, after
reading whatever that peer sent before it ended (:class:`~coursekit.comm.errors.PeerGone`,
a CommTimeout; a peer over TCP is named by the call's timeout).
"""

from __future__ import annotations

import math
import os

import numpy as np
import zmq

from coursekit import checks

from . import cma, frames, shm
from .auth import FrameSealer, check_key
from .base import BARRIER_TAG, describe_op
from .errors import CommError, CommTimeout, PeerGone, tag_name
from .matching import QueuedComm
from .trace import now

SINGLE_COPY_MIN = 1 << 18
"""``sendrecv`` payloads from this many bytes go by single copy between ranks on one host."""

HELLO_TAG = BARRIER_TAG + 64  # internal tags above the barrier's rounds (< 64 of them)
VERDICT_TAG = HELLO_TAG + 1
DONE_TAG = HELLO_TAG + 2
WHO_TAG = HELLO_TAG + 3
LANE_TAG = HELLO_TAG + 4
LANE_OK_TAG = HELLO_TAG + 5

EAGER = 1 << 63
"""Bit of a REMOTE message's id: it came from a plain (buffered) ``send``, so the receiver
copies it as soon as it reads the notice, matched or not."""
TAKEN_BACK = 1 << 62
"""Bit of a 'copied' notice's id: the receiver did not copy it, its sender took it back."""
STAGED = 1 << 61
"""Bit of a REMOTE message's id: a plain send's own copy, posted after taking one back."""
ID_MASK = STAGED - 1


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
                trace: bool = False, single_copy: bool = True,
                shared_memory: bool = True) -> "ZmqComm":
        """Phase 2: connect to every rank's address (``addresses[rank]`` must be ours).

        Every rank must call it (it exchanges a handshake with every other rank), with the
        same ``key`` (bytes, at least 16: the secret that authenticates every frame).
        ``single_copy=False`` keeps this rank's messages on TCP (see the module doc);
        ``shared_memory=False`` keeps single copy but no shared-memory lanes.
        """
        if not isinstance(addresses, (list, tuple)) or not all(isinstance(a, str) for a in addresses):
            raise TypeError("addresses must be a list of address strings, one per rank")
        if not (isinstance(rank, int) and 0 <= rank < len(addresses)):
            raise ValueError(f"rank must be in 0..{len(addresses) - 1}, got {rank!r}")
        checks.boolean(trace, "trace")
        checks.boolean(single_copy, "single_copy")
        checks.boolean(shared_memory, "shared_memory")
        if addresses[rank] != self.address:
            raise ValueError(f"addresses[{rank}] is {addresses[rank]!r} but this endpoint is bound "
                             f"to {self.address!r}: the list must be in rank order")
        return ZmqComm(self, rank, list(addresses), key=check_key(key), timeout=timeout,
                       trace=trace, single_copy=single_copy, shared_memory=shared_memory)

    def close(self) -> None:
        self._pull.close(0)
        self._ctx.term()


def bind(interface: str = "127.0.0.1") -> Endpoint:
    """Phase 1 of the setup: bind a receiving socket on ``interface`` (see module doc)."""
    return Endpoint(interface)


class ZmqComm(QueuedComm):
    """One rank talking to the others over ZeroMQ; build it with ``bind(...).connect(...)``."""

    def __init__(self, endpoint: Endpoint, rank: int, addresses: list[str], *, key: bytes,
                 timeout: float = 30.0, trace: bool = False, single_copy: bool = True,
                 shared_memory: bool = True):
        super().__init__(rank, len(addresses), timeout=timeout, trace=trace)
        self._sealer = FrameSealer(key, rank, len(addresses))
        # (dtype, shape, tag, header) of the last inline send: reused while they repeat
        self._last_sent = (None, None, None, b"")
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
        self._staged: set[int] = set()          # ids of plain sends' own copies in flight
        self._taken_back: set[int] = set()      # ids the receiver saw taken back
        self.rejected = 0                       # frames dropped: they failed authentication
        self.last_rejected: str | None = None   # why the last one was dropped, and its sender
        self._lanes: shm.Lanes | None = None     # shared-memory lanes to same-host peers
        self._lane_out: dict = {}                # dest -> (ring, doorbell) of an enabled lane
        self._lane_headers: dict = {}            # header bytes -> decoded Header (lanes only)
        self._last_lane_header = (b"-", -1, -1, None)  # the last one: bytes, length, sender
        self._poller = None                      # the socket and the doorbell, when lanes exist
        self._socket_peers = True                # some peer is reached over TCP only
        self.shared_memory_requested = shared_memory
        if self.size > 1:
            try:
                self._handshake(single_copy and cma.supported())
                self._open_lanes(shared_memory and shm.supported(), now() + self._timeout)
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

    def _open_lanes(self, enabled: bool, deadline) -> None:
        """Give every same-host peer that single copy works with both ways a shared-memory
        lane (:mod:`coursekit.comm.shm`). Each rank offers (pid, segment fd, doorbell fd,
        token) over the authenticated TCP path (zeros: no lane), maps the segments offered
        to it and says whether that worked; a lane carries messages only when both sides
        said yes. Every other peer stays on TCP. Every rank takes part (a rank with lanes
        off answers no), so ranks may choose differently."""
        others = [r for r in range(self.size) if r != self.rank]
        local = [p for p in others if enabled and p in self._readers and p in self._peer_pid]
        lanes = shm.Lanes(self.rank, self.size, local) if local else None
        try:
            offer = lanes.offer() if lanes else np.zeros(shm.OFFER_WORDS, np.uint64)
            for peer in others:
                self._post(peer, offer if peer in local else np.zeros_like(offer), LANE_TAG, True)
            mapped = {}
            for peer in others:
                theirs = self._match(peer, LANE_TAG, None, deadline, ("connect",))[1]
                mapped[peer] = (peer in local and theirs.shape == offer.shape and bool(theirs.any())
                                and lanes.attach(peer, theirs))
                self._post(peer, np.array([mapped[peer]], np.uint8), LANE_OK_TAG, True)
            for peer in others:
                if self._match(peer, LANE_OK_TAG, None, deadline, ("connect",))[1][0] and mapped[peer]:
                    lanes.enable(peer)
        except BaseException:
            if lanes:
                lanes.close()
            raise
        if lanes is None:
            return
        self._peer_pid[self.rank] = self._pid  # large messages to itself go by single copy too
        self._remote_peers = frozenset(self._peer_pid)
        self._lanes, self._lane_out = lanes, lanes.outbound
        self._socket_peers = len(self._lane_out) < self.size
        self._spinner = shm.Spinner.for_peers(not self._socket_peers)
        self._poller = zmq.Poller()
        self._poller.register(self._pull, zmq.POLLIN)
        self._poller.register(lanes.bell_r, zmq.POLLIN)

    @property
    def single_copy_peers(self) -> frozenset:
        """Ranks this rank sends large ``sendrecv`` payloads to by single copy."""
        return self._readers

    @property
    def shared_memory_peers(self) -> frozenset:
        """Ranks (this one included) whose messages from this rank travel through a
        shared-memory lane instead of TCP."""
        return frozenset(self._lane_out)

    def close(self, linger: float | None = None) -> None:
        """Close the sockets; queued outgoing messages get ``linger`` seconds (default:
        timeout), and so do plain sends' own copies a same-host receiver has not copied
        yet (:meth:`_send_eager`)."""
        if self.closed:
            return
        seconds = self._timeout if linger is None else linger
        if self._staged and self._lanes is not None and self._ready:
            self._flush_staged(now() + seconds)
        super().close()
        self._in_flight.clear()
        cma.withdraw_readers(self)
        if self._lanes is not None:
            self._lanes.close()
            self._lanes, self._lane_out, self._poller = None, {}, None
        ms = int(1000 * seconds)
        for sock in self._push:
            sock.close(ms)
        self._endpoint.close()

    def _flush_staged(self, deadline) -> None:
        """Wait (until ``deadline``) for the receivers of plain sends' own copies."""
        try:
            for message_id in list(self._staged):
                self._await_copied(message_id, self.rank, 0, deadline)
        except CommTimeout:
            pass  # they are dropped with this process's memory: the receiver says so

    def _post(self, dest, arr, tag, buffered):
        if dest in self._lane_out:
            if arr.nbytes > frames.INLINE_MAX:
                return self._post_lane(dest, arr, tag, buffered)
            dtype, shape, last_tag, head = self._last_sent  # the header of the last one?
            if not (arr.dtype is dtype and tag == last_tag and arr.shape == shape):
                head = frames.inline_header(arr, tag, self.rank)
                self._last_sent = (arr.dtype, arr.shape, tag, head)
            record = b"".join((head, arr))  # one INLINE frame: header + payload
            if not self._lanes.put(dest, record):
                self._put_when_room(dest, record, None, tag)
            return None
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

    def _post_lane(self, dest, arr, tag, buffered):
        """Through the shared-memory lane, a payload of more than ``frames.INLINE_MAX``
        bytes (``_post`` puts smaller ones in the ring itself): up to ``shm.RECORD_MAX``
        bytes it is copied into the ring; a larger one stays here and ``dest`` copies it
        out by single copy (``sendrecv`` waits for that in ``_complete``; a plain ``send``:
        see :meth:`_send_eager`)."""
        if arr.nbytes <= shm.RECORD_MAX:
            head, payload = frames.inline_header(arr, tag, self.rank), arr.reshape(-1).view(np.uint8)
        elif buffered:
            self._send_eager(dest, arr, tag)
            return None
        else:
            return self._post_remote(dest, arr, tag, 0)
        if not self._lanes.put(dest, head, payload):
            self._put_when_room(dest, head, payload, tag)
        return None

    def _post_remote(self, dest, arr, tag, flags) -> int:
        """Post a REMOTE record for ``arr`` (kept alive in ``_in_flight``); its id."""
        self._sent += 1
        self._in_flight[self._sent] = arr
        head = frames.encode_remote(arr, tag, self.rank, self._pid, self._sent | flags)
        if not self._lanes.put(dest, head):
            self._put_when_room(dest, head, None, tag)
        return self._sent

    def _send_eager(self, dest, arr, tag) -> None:
        """A plain ``send`` of a large array: single copy when the receiver is in a call,
        and never waiting for one that computes.

        The receiver copies a plain send's array as soon as it reads its notice, in any
        call of its own. So the sender waits ``shm.CLAIM_GRACE_S`` for the copy; then it
        takes the message back, unless the receiver has begun copying it: it writes
        ``cancelled = id`` into the lane, fences and reads ``claimed``, while a receiver
        writes ``claimed = id``, fences and reads ``cancelled`` before it copies
        (Dekker's handshake: at least one of them sees the other's word). A receiver that
        sees ``cancelled`` skips the notice and says so; a sender that sees no claim (or
        hears that) copies the array into a buffer of its own (one memcpy, like
        ``MPI_Bsend``), posts that instead and returns; the buffer is freed when the
        receiver has copied it. t = alpha + n / bw_memcpy for a receiver in a call,
        + n / bw_memcpy for a busy one."""
        deadline = now() + self._timeout
        message_id = self._post_remote(dest, arr, tag, EAGER)
        if self._await_copied(message_id, dest, tag, deadline, now() + shm.CLAIM_GRACE_S):
            return
        ring = self._lanes.ring_to(dest)
        ring.set_cancelled(message_id)
        shm.fence()
        if ring.claimed() == message_id:  # it is copying, or it saw the cancel: its word
            self._await_copied(message_id, dest, tag, deadline)
            if message_id not in self._taken_back:
                return
        self._taken_back.discard(message_id)
        self._in_flight.pop(message_id, None)
        self._staged.add(self._post_remote(dest, arr.copy(), tag, EAGER | STAGED))

    def _put_when_room(self, dest, head, payload, tag) -> None:
        """Put a record that did not fit the ring to ``dest`` (``Lanes.put`` said False),
        once it fits."""
        n = len(head) + (0 if payload is None else len(payload))
        if n > shm.CAPACITY // 2:
            raise ValueError(f"a {n}-byte frame cannot go through a {shm.CAPACITY}-byte ring")
        self._wait_for_room(self._lanes.ring_to(dest), n, dest, tag)
        self._lanes.put(dest, head, payload)

    def _wait_for_room(self, ring, nbytes, dest, tag) -> None:
        """``dest`` left its ring from us too full for ``nbytes`` more: read our own lanes
        meanwhile (keeping what comes for later recvs), so two ranks filling each other's
        rings both go on."""
        deadline = now() + self._timeout
        while not ring.fits(nbytes):
            got = self._lanes.take()
            if got is not None:
                got = self._screen(*self._lane_header(*got))
                if got is not None:
                    self._unmatched.append((got[0], self._park(*got)))
                continue
            if now() >= deadline:
                raise self._timeout_error(("send", dest, tag), dest, tag)
            if self._lanes.gone(dest):
                raise self._peer_gone_error(("send", dest, tag), dest, tag)
            ring.set_writer_waits(True)  # the owner rings when it frees room (unfenced:
            self._lanes.going_to_sleep()  # a missed ring costs one 10 ms nap, not a hang)
            try:
                if not ring.fits(nbytes):
                    self._sleep(min(deadline - now(), 0.01))
            finally:
                self._lanes.woke_up()
                ring.set_writer_waits(False)

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

    def _await_copied(self, message_id, dest, tag, deadline, give_up=None) -> bool:
        """Read incoming messages (keeping them for later recvs) until ``message_id`` is
        copied or taken back (True), or until ``give_up`` (False).

        A timeout leaves the array in ``_in_flight``: the receiver may still read it.
        """
        op = ("send", dest, tag)
        while message_id in self._in_flight and message_id not in self._taken_back:
            try:
                got = self._screen(*self._read_header(
                    deadline if give_up is None else min(deadline, give_up), op, dest, tag,
                    copying=True))
            except CommTimeout:
                if give_up is None or now() >= deadline:
                    raise
                return False
            if got is not None:
                self._unmatched.append((got[0], self._park(*got)))
        return True

    def _screen(self, header, head):
        """(header, head) of a message for matching; None for a 'copied' notice (noted)
        and for a plain send's notice its sender took back (answered)."""
        if header.tag == DONE_TAG:
            self._note_done(header, head)
            return None
        if header.remote and self._lanes is not None and self._withdrawn(header, head):
            return None
        return header, head

    def _withdrawn(self, header, head) -> bool:
        """Claim a plain send's REMOTE notice from a lane before copying it; True (and
        tell the sender) when the sender took it back first (see :meth:`_send_eager`)."""
        message_id = frames.descriptor(header, head)[2]
        ring = self._lanes.inbound.get(header.source)
        if not message_id & EAGER or message_id & STAGED or ring is None:
            return False
        message_id &= ID_MASK
        ring.set_claimed(message_id)
        shm.fence()
        # the sender resolves each plain send before the next (copied, or taken back), so
        # a notice still unread here with an id up to the last one taken back was taken back
        if ring.cancelled() < message_id:
            return False
        self._post(header.source, np.array([message_id | TAKEN_BACK], np.uint64), DONE_TAG, True)
        return True

    def _note_done(self, header, head) -> None:
        readers = self._readers if self._lanes is None else self._readers | {self.rank}
        if header.source not in readers or header.shape != (1,) or header.dtype != np.uint64:
            raise CommError(f"rank {self.rank}: dropped a malformed 'copied' notice from rank "
                            f"{header.source}")
        value = int(frames.to_array(header, head, header.size)[0])
        message_id = value & ID_MASK
        if value & TAKEN_BACK:
            if message_id in self._in_flight:
                self._taken_back.add(message_id)
            return
        self._in_flight.pop(message_id, None)
        self._staged.discard(message_id)

    def _next_header(self, deadline, op, peer, tag):
        """The next message for matching (see :meth:`_screen`)."""
        while True:
            got = (self._read_lanes_or_socket(deadline, op, peer, tag) if self._lanes is not None
                   else self._read_header(deadline, op, peer, tag))  # the first, straight away
            header = got[0]
            if header.tag != DONE_TAG and not header.remote:  # _screen would pass it as it is
                return got
            got = self._screen(*got)
            if got is not None:
                return got

    def _park(self, header, head):
        """A single-copy message nobody asked for yet stays in its sender's memory: it is
        copied once, straight into the ``out`` of the ``recv`` that takes it (copying it now
        into a fresh array, then into ``out``, held up to one message per step a faster
        peer ran ahead: allreduce peaks of ~2x the array against the model's 1.25x, issue
        29). The sender waits for the copy as if the notice had come later; MPI's
        rendezvous sends do the same."""
        if header.remote and not frames.descriptor(header, head)[2] & EAGER:
            return head
        return super()._park(header, head)  # a plain send's: copied now (the sender waits)

    def _unpark(self, header, parked, target):
        if header.remote and not isinstance(parked, np.ndarray):
            return self._payload(header, parked, target)
        return super()._unpark(header, parked, target)

    def _payload(self, header, head, target):
        if not header.remote:
            if target is None and type(head) is memoryview:  # in a ring: copied out now
                target = np.empty(header.shape, header.dtype)
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

    def _read_header(self, deadline, op, peer, tag, copying=False):
        """The next message's (header, first part); ``copying``: the wait is for a peer
        copying a large array of ours (see :meth:`_read_lanes_or_socket`)."""
        if self._lanes is not None:
            return self._read_lanes_or_socket(deadline, op, peer, tag, copying)
        sock = self._pull
        if self._rcvtimeo_full != self._timeout:
            # the first wait may take the whole timeout: the call began microseconds ago
            self._set_rcvtimeo(min(math.ceil(self._timeout * 1000), 2**31 - 1))
            self._rcvtimeo_full = self._timeout
        while True:
            try:
                frame = sock.recv(copy=False)
            except zmq.Again:
                left = deadline - now()
                if left <= 0:
                    raise self._timeout_error(op, peer, tag) from None
                self._set_rcvtimeo(math.ceil(left * 1000))
                self._rcvtimeo_full = None
                continue
            got = self._accept(frame)
            if got is not None:
                return got

    def _read_lanes_or_socket(self, deadline, op, peer, tag, copying=False):
        """The next message from a lane or the socket: poll both (the socket only if some
        peer is on TCP), yielding the core after every ``spinner.polls`` polls, while
        spinning pays (``shm.Spinner``: both adapt to whether the core is shared), then
        sleep on the doorbell and the socket (see :mod:`coursekit.comm.shm` for why no
        wake-up is lost). Frames on the socket that fail authentication are read and
        dropped while it sleeps.

        A wait while a peer copies a large array of ours (``copying``) lasts n / bw_memcpy
        whatever the cores do (a third of a millisecond for 2 MiB), so it teaches the
        Spinner nothing: counted, it took the credit of a ping-pong's large sizes away and
        left the next small messages sleeping (80 us instead of 30)."""
        got = self._poll_once()
        if got is not None:
            return got
        spinner, lanes = self._spinner, self._lanes
        start, spin = now(), spinner.budget()
        yielded = start
        polls, switched = spinner.polls, False
        if spin:
            lanes.spinning()
        while spin:
            for _ in polls:
                got = self._poll_once()
                if got is not None:
                    lanes.waited()
                    if not copying:
                        spinner.found(switched)
                    return got
            if yielded - start >= spin:
                break
            before = now()
            os.sched_yield()  # a peer that shares this core answers meanwhile
            back = now()
            if back - before > shm.SWITCHED_YIELD_S and not copying:
                spinner.switched()
                polls, switched = spinner.polls, True
            if back - yielded > shm.LATE_YIELD_S and lanes.others_running() > 0:
                if not copying:  # the core went to a stranger's time slice
                    spinner.yielded_late()
                break
            yielded = back
        asleep = now()
        got = self._sleep_until_message(deadline, op, peer, tag)
        if spin and not copying:
            spinner.slept(now() - asleep)
        return got

    def _poll_once(self):
        """The next message waiting in a lane, or on the socket where some peer is on TCP;
        None when there is none now."""
        got = self._lanes.take()
        if got is not None:
            return self._lane_header(*got)
        return self._socket_frame() if self._socket_peers else None

    def _sleep_until_message(self, deadline, op, peer, tag):
        """Sleep on the doorbell and the socket until a message comes (CommTimeout at
        ``deadline``; PeerGone once ``peer``'s process has ended and nothing it sent is
        left)."""
        lanes = self._lanes
        while True:
            t = now()
            if t >= deadline:
                raise self._timeout_error(op, peer, tag)
            lanes.going_to_sleep()
            try:
                got = lanes.take()
                if got is not None:
                    return self._lane_header(*got)
                socket_ready = self._sleep(min(deadline - t, shm.PEER_CHECK_S))
            finally:
                lanes.woke_up()
            got = self._poll_once()
            if got is None and socket_ready and not self._socket_peers:
                got = self._socket_frame()
            if got is None and lanes.gone(peer):
                got = self._poll_once()  # the last thing it sent, if it came meanwhile
                if got is None:
                    raise self._peer_gone_error(op, peer, tag)
            if got is not None:
                return got

    def _peer_gone_error(self, op, peer, tag) -> PeerGone:
        return PeerGone(f"rank {self.rank}: {describe_op(op)} stopped waiting for rank {peer} "
                        f"(tag {tag_name(tag)}): its process has exited, and no message it "
                        "sent before is left to match")

    def _sleep(self, seconds: float) -> bool:
        """Wait until the doorbell rings or the socket has a frame (True: the socket)."""
        ready = dict(self._poller.poll(max(1, math.ceil(seconds * 1000))))
        return self._pull in ready

    def _socket_frame(self):
        """The next message on the socket if one is there, else None; frames that fail
        authentication are dropped on the way."""
        while True:
            try:
                frame = self._pull.recv(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return None
            got = self._accept(frame)
            if got is not None:
                return got

    def _accept(self, frame):
        """(header, first part) of a frame read from the socket; None when it fails
        authentication (it is counted in ``rejected`` and dropped with its parts)."""
        more = frame.more
        try:
            head = self._sealer.open(frame, frame.get("Peer-Address") or "an unknown address")
        except CommError as exc:  # not this comm's: changes nothing, so wait on
            self._drain(more)
            self.rejected += 1
            self.last_rejected = str(exc)
            return None
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

    def _lane_header(self, source, frame):
        """(header, frame) of a record read from ``source``'s lane. Decoded headers are
        kept by their bytes (a training loop sends the same few over and over); the last
        one is checked first, by its bytes, its sender and its record's length."""
        key, length, sender, header = self._last_lane_header
        if sender == source and len(frame) == length and (
                frame.startswith(key) if type(frame) is bytearray else frame[:len(key)] == key):
            return header, frame
        try:
            key = bytes(frame[:frames.HEADER_MIN + 8 * frame[5]])
            header = self._lane_headers[key]
        except (IndexError, KeyError):
            header = None
        length = len(frame)
        if header is None or length != header.size + (
                header.nbytes if header.inline else frames.DESCRIPTOR.size):
            header = self._decode(frame)
            if len(self._lane_headers) >= 1024:
                self._lane_headers.clear()
            key = bytes(frame[:header.size])
            self._lane_headers[key] = header
        if header.source != source or not (header.inline or header.remote):
            raise CommError(f"rank {self.rank}: dropped a record of rank {source}'s "
                            f"shared-memory lane: it claims rank {header.source} or is not one "
                            "inline or remote frame")
        self._last_lane_header = key, length, source, header
        return header, frame

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
