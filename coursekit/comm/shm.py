"""Shared-memory lanes: messages between ranks on one host without a socket.

MPICH's and NCCL's shared-memory transports give every pair of ranks on a node a ring
in memory both can map; ZmqComm does the same for its same-host peers
(:mod:`coursekit.comm.zmq`). Each rank owns one segment holding an **inbound ring per
sender** (itself included) and a **doorbell**:

* the segment is a ``memfd`` (``memfd_create``): anonymous memory with no name in
  ``/dev/shm`` or anywhere else, mode 0600. Peers open it through
  ``/proc/<owner pid>/fd/<n>``, which the kernel allows only to processes that may
  inspect the owner (the same user, ptrace-read permission). The memory lives while a
  process maps it: when every rank is gone, however it died (SIGKILL included), the
  kernel frees it and nothing is left behind to clean up;
* a ring is ``head`` (bytes the sender has written, ever), ``tail`` (bytes the owner has
  read, ever) and ``CAPACITY`` bytes of records, 8-byte aligned: ``u32 length, u32 kind``
  then one frame (:mod:`coursekit.comm.frames`, INLINE or REMOTE). Only the sender
  writes ``head``, only the owner ``tail`` (single producer, single consumer: no lock).
  The sender stores the record before it stores ``head``; x86-64 keeps stores in order
  (TSO), which is why lanes are used on x86-64 only;
* the doorbell is a non-blocking pipe and a ``sleeping`` word in the owner's segment. A
  waiting owner polls its rings for up to ``SPIN_S`` (``SOCKET_SPIN_S`` where some peers
  are on TCP), yielding its core between polls (see :class:`Spinner`), then sets
  ``sleeping``, looks once more and sleeps in ``poll`` on the pipe (and on its TCP
  socket). A sender stores its record and ``head``, then reads ``sleeping`` and writes a
  byte into the pipe only if it is set. Both sides put a full memory fence between their
  store and their load (:func:`fence`), so at least one sees the other's store: either the
  owner's last look finds the record or the sender rings. No wake-up is lost, and a
  spinning owner costs its senders no system call.

Cost of a message of n bytes through a lane: two memcpys (into the ring, out of it)
plus a pipe write: t = alpha_shm + 2 n / bw_memcpy, with alpha_shm a few microseconds of
Python. Payloads above ``RECORD_MAX`` do not go through the ring: the sender posts a
REMOTE record and the owner copies the array straight out of the sender's memory
(:mod:`coursekit.comm.cma`), t = alpha_shm + n / bw_memcpy.
"""

from __future__ import annotations

import errno
import mmap
import os
import platform
import select
import struct
import sys
import threading
import time

import numpy as np

from .errors import CommError

CAPACITY = 1 << 21
"""Bytes of records in each ring (a sender waits when its receiver left this much unread)."""
RECORD_MAX = 1 << 19
"""Payloads up to this many bytes are copied through the ring (two copies, and the sender
goes on at once); larger ones by single copy (one copy, but the sender waits until the
receiver has made it). Up to 512 KiB the two copies win: ping-pong of 128 KiB / 256 KiB /
512 KiB took 16-21 / 27-31 / 47-56 us one-way through the ring against 30-33 / 38 / 57-68
by single copy on a 2-core VM, and a 1 MiB allreduce of 4 ranks on its 2 cores (256 KiB
messages) 1.5 ms against 3.5 ms, where every single copy waited for a rank to be
scheduled. At most a quarter of CAPACITY, so two records always fit."""
COPIED_MAX = 1 << 14
"""A receiver copies a record of up to this many bytes out of the ring at once; it reads a
longer one in place, so that its payload is copied once, into the array it ends in (a
``recv(out=)``'s ``out``): a 4-rank 1 MiB allreduce on 2 cores moves 256 KiB per step."""
SPIN_S = 1e-3
"""How long a waiting rank polls its rings before it sleeps, while spinning pays: longer
than a ring step where ranks outnumber cores (4 ranks on 2 cores, 1 MiB allreduce: 99 % of
the waits end within 0.65 ms), so that such a step is caught spinning instead of after a
wake-up (50-150 us on a small VM, with the core idle meanwhile). 100 us left the 4 ranks'
cores idle 40 % of the time (``perf``, 2-core VM, 2026-12-02)."""
PROBE_S = 2e-3
"""How long a probing wait spins (see :class:`Spinner`)."""
SOCKET_SPIN_S, SOCKET_PROBE_S = 100e-6, 1e-3
"""The same where some peers are on TCP (other hosts): a message from such a peer needs
the ZeroMQ I/O threads of both ranks, which a longer spin on a shared core delays. Four
engines on two network-namespace hosts on 2 cores fitted a busy-link alpha of 372, 647
and 1616 us spinning up to 1 ms, 459 and 489 us spinning 100 us (ch03, 2026-12-02)."""
MAX_POLLS_PER_YIELD = 16
"""The most polls of its rings a spinning rank makes between two yields of its core
(see :class:`Spinner`)."""
SWITCHED_YIELD_S = 2e-6
"""A yield that takes longer than this gave the core to another process (a yield nobody
takes is one system call, a fraction of a microsecond; a switch there and back costs
more)."""
LATE_YIELD_S = 300e-6
"""A spinning rank yields its core between polls (``os.sched_yield``); a yield that comes
back later than this gave the core to a process that ran a whole time slice: if that may
have been a stranger's, the rank stops spinning and sleeps (see :class:`Spinner`)."""
BUSY_AFTER_WAIT_S = 1e-3
"""A rank whose last wait ended less than this ago counts as running for its peers: it
computes between two waits of an exchange (a 256 KiB reduction takes tens of us)."""
CLAIM_GRACE_S = 2e-3
"""How long a plain send of a large array waits for its receiver to start copying it
before it takes it back and sends a copy of its own instead (ZmqComm._send_eager)."""
PEER_CHECK_S = 0.5
"""A rank sleeping on a lane peer looks this often whether that peer's process has ended
(:meth:`Lanes.gone`), so a dead peer is named within this instead of after the timeout."""


class Spinner:
    """Whether a wait should spin first: only while spinning has been paying.

    A spinning rank polls its rings and yields its core between polls, so a rank that
    shares the core gets it at once: where ranks outnumber free cores (4 engines on a
    2-core laptop), the peer that has to answer runs while this rank waits, instead of
    after this rank's spin or time slice ends. A 1 MiB ring allreduce of 4 ranks on 2
    cores took 1.26-1.36 ms against 1.7-2.0 ms sleeping at once (a wake-up is 50-150 us
    on a small VM, and every ring step needs one) and 2.1 ms spinning without yields.

    Where nobody else waits for the core, a yield is a system call that returns at once,
    and a wait spent yielding after every poll answers later than one spent polling: 8 B
    ping-pong one-way 4.3-4.5 us against 3.8-4.0 with up to 16 polls per yield (the same
    code otherwise, alternating runs on a 2-core VM).
    But 16 polls per yield halved a 4-rank 1 KiB allreduce on 2 cores (busbw 0.0019
    against 0.0040 GB/s): a peer on the core waited 16 polls each time. So the number of
    polls per yield (``polls``) adapts: a yield that took longer than
    ``SWITCHED_YIELD_S`` gave the core to somebody, and the rank yields after every poll
    again (``switched``); each wait that found its message with no such yield doubles it,
    up to ``MAX_POLLS_PER_YIELD``.

    A yield that returns after ``LATE_YIELD_S`` gave the core to a process that ran a
    whole time slice. A peer's slice is the spin working (it did its part of the exchange
    meanwhile: in a 4-rank ring on 2 cores a fifth of the waits see one); a stranger's
    slice (a computation that is not our peer) means a message that comes waits for that
    slice, where a sleeping rank would be woken by its doorbell. Which it was is told by
    counting (:meth:`Lanes.others_running`): if more tasks are runnable on the host than
    this rank and its running peers, such a wait stops spinning and costs
    ``LATE_PENALTY`` credit. Each wait whose message came while spinning earns credit;
    each whose message came within ``probe_s`` of going to sleep loses some (the spin
    gave up just too early). A wait that slept longer says nothing
    about cores (its sender was computing) and leaves the credit as it is. Without credit
    a rank sleeps at once, except that one wait in ``PROBE`` spins ``probe_s``, longer
    than ``spin_s``, to notice when the cores are its peers' again (longer, because its
    peer may be asleep too and take a wake-up to answer). Open MPI's
    ``mpi_yield_when_idle`` makes the choice to yield once, from a count of ranks and
    cores.
    """

    PROBE = 32
    MAX_CREDIT = 8
    LATE_PENALTY = 4

    def __init__(self, spin_s: float = SPIN_S, probe_s: float = PROBE_S):
        self.spin_s, self.probe_s = spin_s, probe_s
        self.credit, self.waits = self.MAX_CREDIT, 0
        self.polls = range(1)  # polls between two yields

    @classmethod
    def for_peers(cls, all_on_lanes: bool) -> "Spinner":
        """The Spinner of a comm whose peers are all on lanes, or not (some on TCP)."""
        return cls() if all_on_lanes else cls(SOCKET_SPIN_S, SOCKET_PROBE_S)

    def switched(self) -> None:
        """A yield gave the core to another process: yield after every poll."""
        self.polls = range(1)

    def budget(self) -> float:
        """Seconds the next wait may spin."""
        self.waits += 1
        if self.credit > 0:
            return self.spin_s
        return self.probe_s if self.waits % self.PROBE == 0 else 0.0

    def found(self, switched: bool = False) -> None:
        """The message came while spinning (``switched``: after a yield that gave the core
        to somebody)."""
        self.credit = min(self.MAX_CREDIT, self.credit + 2)
        if not switched and len(self.polls) < MAX_POLLS_PER_YIELD:
            self.polls = range(2 * len(self.polls))

    def yielded_late(self) -> None:
        """A yield came back after ``LATE_YIELD_S``: the spin stops (and sleeps)."""
        self.credit = max(0, self.credit - self.LATE_PENALTY)

    def slept(self, seconds: float) -> None:
        """Spinning ran out; the message came ``seconds`` after the rank went to sleep."""
        if seconds < self.probe_s:
            self.credit = max(0, self.credit - 1)

_CONTROL = 192              # head at +0, tail at +64, writer_waiting at +128: own cache lines;
                            # claimed at +160, cancelled at +176 (see ZmqComm._send_eager)
_RING = _CONTROL + CAPACITY
_RECORD = struct.Struct("<II")  # length of the frame, kind
_FRAME, _WRAP = 0, 1
OFFER_WORDS = 5
"""Length in u64 words of :meth:`Lanes.offer` (pid, segment fd, doorbell fd, token)."""
_TOKEN = 16                 # the segment begins with a random token its peers check ...
_PREFIX = 128               # ... in a prefix that keeps the rings on 64-byte lines
_PAGE = mmap.PAGESIZE
_SLEEPING = 8               # the u64 word of the prefix saying "the owner sleeps: ring"
_BUSY_UNTIL = 2             # the prefix's u64 word saying until when (CLOCK_MONOTONIC ns) the
_FOREVER = (1 << 64) - 1    # owner runs (on another cache line than _SLEEPING, which senders read)


def supported() -> bool:
    """Lanes need Linux (memfd, /proc/<pid>/fd) and x86-64's store order (see module doc)."""
    return (sys.platform.startswith("linux") and hasattr(os, "memfd_create")
            and platform.machine() in ("x86_64", "AMD64"))


def _align(n: int) -> int:
    return (n + 7) & ~7


class Ring:
    """One sender's ring inside a receiver's segment, seen through ``view`` (a memoryview
    of the whole segment, cast to bytes) and ``words`` (the same memory as u64)."""

    def __init__(self, view: memoryview, words: memoryview, offset: int):
        self.view, self.words = view, words
        self.data = offset + _CONTROL
        word = offset // 8
        self.head_at, self.tail_at, self.waiting_at = word, word + 8, word + 16
        self.claimed_at, self.cancelled_at = word + 20, word + 22  # owner's, sender's

    def prefault(self) -> None:
        """Touch every page of the ring through this mapping, before any record exists
        (zeros, which nobody reads). Otherwise the first 1 MiB of messages each pay page
        faults in both processes (about 200 us more per 32 KiB message on this course's
        2-core VMs), and those slow waits would cost the Spinner its credit."""
        np.frombuffer(self.view, np.uint8, CAPACITY, self.data)[::_PAGE] = 0

    # ---- the sender's side --------------------------------------------------------------
    def fits(self, nbytes: int) -> bool:
        """True when a record of a ``nbytes``-byte frame fits now."""
        return self.room(_align(_RECORD.size + nbytes))

    def room(self, need: int) -> bool:
        """True when a record of ``need`` bytes (aligned) fits now."""
        head = self.words[self.head_at]
        pos = head % CAPACITY
        if pos + need > CAPACITY:  # it would wrap: the rest of the ring is skipped
            need += CAPACITY - pos
        return CAPACITY - (head - self.words[self.tail_at]) >= need

    def append(self, head_bytes, payload=None) -> bool:
        """Append one record (``head_bytes`` + ``payload`` bytes); False, writing nothing,
        when it does not fit now. Every record starts on an 8-byte boundary, so its
        ``u32 length, u32 kind`` is stored as one u64 word (length | kind << 32)."""
        words, view = self.words, self.view
        n = len(head_bytes) if payload is None else len(head_bytes) + len(payload)
        need = (_RECORD.size + n + 7) & ~7  # _align, inlined
        head = words[self.head_at]
        pos = head % CAPACITY
        skip = CAPACITY - pos if pos + need > CAPACITY else 0  # room()'s wrap, inlined
        if CAPACITY - (head - words[self.tail_at]) < need + skip:
            return False
        if skip:
            words[(self.data + pos) >> 3] = _WRAP << 32
            head += skip
            pos = 0
        at = self.data + pos
        words[at >> 3] = n  # kind _FRAME is 0
        at += _RECORD.size
        end = at + len(head_bytes)
        view[at:end] = head_bytes
        if payload is not None:
            view[end:end + len(payload)] = payload
        words[self.head_at] = head + need  # after the record (x86-64 stores stay in order)
        return True

    # ---- the owner's side ---------------------------------------------------------------
    def take(self) -> bytearray | memoryview | None:
        """The next frame, or None when empty. One of up to ``COPIED_MAX`` bytes is copied
        out and its space given back; a longer one is a view into the ring, whose space
        stays taken until :meth:`release` (so its payload is copied once, straight to
        where it goes)."""
        words, tail_at = self.words, self.tail_at
        tail = words[tail_at]
        if words[self.head_at] == tail:
            return None
        data = self.data
        pos = tail % CAPACITY
        word = words[(data + pos) >> 3]  # u32 length, u32 kind: see append
        if word >> 32 == _WRAP:
            tail += CAPACITY - pos
            pos = 0
            word = words[data >> 3]
        n, kind = word & 0xFFFFFFFF, word >> 32
        if kind != _FRAME or _RECORD.size + n > CAPACITY - pos:
            raise CommError(f"shared-memory ring corrupted: record kind {kind}, length {n}")
        at = data + pos + _RECORD.size
        tail += (_RECORD.size + n + 7) & ~7  # _align, inlined
        if n > COPIED_MAX:
            self.held_tail = tail
            return self.view[at:at + n]
        frame = bytearray(self.view[at:at + n])
        words[tail_at] = tail
        return frame

    def release(self) -> None:
        """Give back the space of the frame :meth:`take` returned as a view."""
        self.words[self.tail_at] = self.held_tail

    def claimed(self) -> int:
        """The id of the last plain-send notice the owner began to copy."""
        return self.words[self.claimed_at]

    def set_claimed(self, message_id: int) -> None:
        self.words[self.claimed_at] = message_id

    def cancelled(self) -> int:
        """The id of the last plain-send notice its sender took back."""
        return self.words[self.cancelled_at]

    def set_cancelled(self, message_id: int) -> None:
        self.words[self.cancelled_at] = message_id

    def writer_waits(self) -> bool:
        return bool(self.words[self.waiting_at])

    def set_writer_waits(self, on: bool) -> None:
        self.words[self.waiting_at] = int(on)


class Segment:
    """A memfd of ``n_rings`` rings after a 16-byte token, mapped into this process."""

    def __init__(self, fd: int, n_rings: int):
        self.fd = fd
        self.mm = mmap.mmap(fd, _PREFIX + n_rings * _RING)
        self.view = memoryview(self.mm)
        self.words = self.view.cast("Q")

    def ring(self, index: int) -> Ring:
        return Ring(self.view, self.words, _PREFIX + index * _RING)

    def token(self) -> bytes:
        return bytes(self.view[:_TOKEN])

    def close(self) -> None:
        self.words.release()
        self.view.release()
        try:
            self.mm.close()
        except BufferError:  # a frame read in place is still referenced (a traceback's):
            pass             # the memory is unmapped when the last reference goes
        os.close(self.fd)


def open_peer_fd(pid: int, fd: int, flags: int) -> int:
    """Open file descriptor ``fd`` of process ``pid`` (the kernel checks we may inspect it)."""
    return os.open(f"/proc/{pid}/fd/{fd}", flags | os.O_CLOEXEC)


class Lanes:
    """This rank's inbound segment and doorbell, and the rings it writes into its peers'.

    The segment has one ring per rank of the world (ring ``s`` is written by rank ``s``;
    pages of rings nobody writes are never touched, so they cost no memory); this rank
    reads the rings of ``senders`` (its same-host peers and itself), whose pages it
    touches up front (:meth:`Ring.prefault`): 1 MiB per same-host peer. Build it, send
    :meth:`offer` to each peer over an authenticated channel, call :meth:`attach` with
    each peer's offer, then :meth:`enable` for the peers whose attach succeeded on both
    sides.
    """

    def __init__(self, rank: int, size: int, senders):
        self.rank = rank
        self.size = size
        name = f"coursekit-comm-rank{rank}-{os.urandom(6).hex()}"
        fd = os.memfd_create(name, os.MFD_CLOEXEC)
        try:
            os.fchmod(fd, 0o600)
            os.ftruncate(fd, _PREFIX + size * _RING)
            self.segment = Segment(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self.name = name
        self.segment.view[:_TOKEN] = os.urandom(_TOKEN)
        self.inbound = {s: self.segment.ring(s) for s in sorted({rank, *senders})}
        for ring in self.inbound.values():
            ring.prefault()  # before the offer: nobody writes into them yet
        order = [(s, ring, ring.head_at, ring.tail_at) for s, ring in self.inbound.items()]
        count = len(order)  # round robin: _rounds[k] visits rings k, k+1, ... (and says which is next)
        self._rounds = [[((k + i + 1) % count, *order[(k + i) % count]) for i in range(count)]
                        for k in range(count)]
        self._next = 0
        self._held = None  # (ring, its sender) of a frame take() returned as a view
        self.bell_r, self.bell_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        self.attached: dict[int, tuple[Segment, int]] = {}  # peer -> its segment, its bell
        self.outbound: dict[int, tuple[Ring, int]] = {}            # enabled peers: ring, bell fd
        self.outbound[rank] = (self.inbound[rank], self.bell_w)
        self.watches: dict[int, int] = {}  # peer -> pidfd of its process (readable once it ends)
        try:
            self._loadavg = os.open("/proc/loadavg", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._loadavg = None

    def offer(self) -> np.ndarray:
        """(pid, segment fd, doorbell fd, token) for the peers, as u64 words."""
        token = np.frombuffer(self.segment.token(), np.uint64)
        return np.array([os.getpid(), self.segment.fd, self.bell_w, *token], np.uint64)

    def attach(self, peer: int, offer) -> bool:
        """Map ``peer``'s segment and open its doorbell from its ``offer``; False if not
        possible (another user, a process that is gone, a token that does not match)."""
        pid, seg_fd, bell_fd, *token = (int(v) for v in offer)
        watch = watch_process(pid)  # before the token check: then it is the peer's process
        opened = self._open_peer(pid, seg_fd, bell_fd, token)
        if opened is None:
            close_watch(watch)
            return False
        self.attached[peer] = opened
        if watch is not None:
            self.watches[peer] = watch
        return True

    def _open_peer(self, pid, seg_fd, bell_fd, token) -> tuple[Segment, int] | None:
        """(segment, doorbell fd) of process ``pid``'s offer, or None (see :meth:`attach`)."""
        try:
            fd = open_peer_fd(pid, seg_fd, os.O_RDWR)
        except OSError:
            return None
        try:
            if os.fstat(fd).st_size != _PREFIX + self.size * _RING:
                raise ValueError("a segment of another size")
            segment = Segment(fd, self.size)
        except (OSError, ValueError):
            os.close(fd)
            return None
        if segment.token() != np.array(token, np.uint64).tobytes():
            segment.close()
            return None
        try:
            bell = open_peer_fd(pid, bell_fd, os.O_WRONLY | os.O_NONBLOCK)
        except OSError:
            segment.close()
            return None
        return segment, bell

    def gone(self, peer) -> bool:
        """True when ``peer`` is a lane peer whose process has exited (however it ended)."""
        watch = self.watches.get(peer)
        if watch is None:
            return False
        poller = select.poll()
        poller.register(watch, select.POLLIN)
        return bool(poller.poll(0))

    def enable(self, peer: int) -> None:
        """Start writing to ``peer`` through our ring (number ``self.rank``) in its segment."""
        segment, bell = self.attached[peer]
        ring = segment.ring(self.rank)
        ring.prefault()  # its owner never reads the data of an empty ring
        self.outbound[peer] = (ring, bell)

    # ---- sending ------------------------------------------------------------------------
    def put(self, dest: int, head_bytes, payload=None) -> bool:
        """Append a record (``head_bytes`` + ``payload`` bytes) for ``dest`` and ring its
        doorbell if it sleeps; False (nothing written) when its ring has no room now."""
        if self._held is not None:
            self.release()
        ring, bell = self.outbound[dest]
        if not ring.append(head_bytes, payload):
            return False
        fence()
        if ring.words[_SLEEPING]:
            ring_bell(bell)
        return True

    def ring_to(self, dest: int) -> Ring:
        return self.outbound[dest][0]

    # ---- receiving ----------------------------------------------------------------------
    def take(self):
        """(source, frame) of the next record of any inbound ring (round robin), or None."""
        words = self.segment.words  # every inbound ring's head and tail are words of it
        if self._held is not None:
            self.release()
        for after, source, ring, head_at, tail_at in self._rounds[self._next]:
            if words[head_at] == words[tail_at]:  # empty: ring.take() would say None
                continue
            frame = ring.take()
            if frame is not None:
                self._next = after
                if type(frame) is memoryview:  # a view into the ring: see release
                    self._held = ring, source
                elif ring.words[ring.waiting_at]:  # ring.writer_waits(), inlined
                    ring.set_writer_waits(False)
                    ring_bell(self.bell_of(source))
                return source, frame
        return None

    def release(self) -> None:
        """Give back the ring space of the frame the last :meth:`take` returned as a view
        (a record longer than ``COPIED_MAX``): that view must not be read afterwards. The
        next ``take`` or ``put`` does it, if the caller has not."""
        ring, source = self._held
        self._held = None
        ring.release()
        if ring.words[ring.waiting_at]:
            ring.set_writer_waits(False)
            ring_bell(self.bell_of(source))

    def bell_of(self, peer: int) -> int:
        return self.outbound[peer][1]

    # ---- telling peers from strangers ---------------------------------------------------
    def spinning(self) -> None:
        """Tell the peers this rank runs (it polls its rings) until further notice."""
        self.segment.words[_BUSY_UNTIL] = _FOREVER

    def waited(self) -> None:
        """Tell the peers this rank runs for ``BUSY_AFTER_WAIT_S`` more (its wait ended)."""
        self.segment.words[_BUSY_UNTIL] = time.monotonic_ns() + int(BUSY_AFTER_WAIT_S * 1e9)

    def others_running(self) -> int:
        """How many runnable tasks on this host are neither this rank nor a running peer
        (:meth:`running_peers`): the count of runnable tasks (:meth:`runnable_tasks`, this
        rank among them) less those. Where it cannot be read, 1: assume a stranger."""
        running = self.runnable_tasks()
        return 1 if running is None else running - 1 - self.running_peers()

    def runnable_tasks(self) -> int | None:
        """Tasks (threads) runnable on this host now, the caller among them: the fourth
        field of ``/proc/loadavg`` (``running/total``), read in about a microsecond; None
        where there is none."""
        try:
            return int(os.pread(self._loadavg, 64, 0).split()[3].split(b"/")[0])
        except (TypeError, OSError, ValueError, IndexError):
            return None

    def running_peers(self) -> int:
        """Same-host peers that run now: they spin, or ended a wait within
        ``BUSY_AFTER_WAIT_S`` (:meth:`spinning`, :meth:`waited`; a sleeping one does not)."""
        now = time.monotonic_ns()
        return sum(1 for segment, _ in self.attached.values() if segment.words[_BUSY_UNTIL] > now)

    def going_to_sleep(self) -> None:
        """Ask senders to ring (then take one last look before sleeping on the pipe)."""
        words = self.segment.words
        words[_BUSY_UNTIL] = 0
        words[_SLEEPING] = 1
        fence()

    def woke_up(self) -> None:
        """Senders need not ring any more; empty the pipe."""
        self.segment.words[_SLEEPING] = 0
        self.waited()
        try:
            while os.read(self.bell_r, 4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        """Unmap everything and close every descriptor."""
        for segment, bell in self.attached.values():
            segment.close()
            os.close(bell)
        self.attached.clear()
        for watch in self.watches.values():
            os.close(watch)
        self.watches.clear()
        self.outbound.clear()
        self.inbound.clear()
        self._rounds = [[]]
        self._next = 0
        self._held = None
        self.segment.close()
        os.close(self.bell_r)
        os.close(self.bell_w)
        if self._loadavg is not None:
            os.close(self._loadavg)


def watch_process(pid: int) -> int | None:
    """A pidfd of process ``pid`` (Linux >= 5.3), or None where there is none: then a dead
    peer is named by the timeout of the call that waits for it."""
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def close_watch(watch: int | None) -> None:
    if watch is not None:
        os.close(watch)


def fence() -> None:
    """A full memory fence: acquiring an uncontended lock runs a locked read-modify-write
    instruction (x86 ``lock cmpxchg``/``lock xadd`` in the C library's semaphore), which no
    load can pass. Costs ~0.2 us, a system call ~1 us. The lock is a fresh one each time:
    a KeyboardInterrupt between acquiring and releasing a shared lock left it held, and
    the engine's next fence (its next comm, after ``reset_comm``) waited forever."""
    threading.Lock().acquire()


def ring_bell(fd: int) -> None:
    """Wake the owner of a doorbell (a full pipe already wakes it: nothing to add)."""
    try:
        os.write(fd, b"\0")
    except BlockingIOError:
        pass
    except OSError as exc:
        if exc.errno != errno.EPIPE:
            raise

