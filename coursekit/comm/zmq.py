"""ZmqComm: point-to-point messages between processes over ZeroMQ (TCP).

Topology: every rank binds one PULL socket and connects one PUSH socket to every rank's
PULL (itself included), so the messages from one sender to one receiver travel over one
FIFO TCP stream (MPI's non-overtaking rule holds). ZeroMQ's I/O thread reads incoming
messages eagerly into an unbounded queue, so sends are buffered and two ranks may send
to each other at the same time without deadlock.

Setup is two-phase so any launcher can drive it (ipyparallel, multiprocessing, a shell)::

    ep = bind("127.0.0.1")               # phase 1, on every rank: bind, learn the address
    addresses = <gather ep.address from all ranks, in rank order>
    comm = ep.connect(rank, addresses)   # phase 2: connect to everybody

Cost: payloads up to ``frames.INLINE_MAX`` bytes are copied into one message with the
header; larger C-contiguous arrays are sent zero-copy (``copy=False``): ``send`` returns
when ZeroMQ has written them to the kernel, i.e. t = alpha + n / bw with no extra memcpy.
A received large payload is returned without a copy (the array views ZeroMQ's buffer);
``recv(out=buf)`` receives straight into ``buf`` (one memcpy).
"""

from __future__ import annotations

import math

import zmq

from . import frames
from .errors import CommError
from .matching import QueuedComm
from .trace import now


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

    def connect(self, rank: int, addresses: list[str], *, timeout: float = 30.0,
                trace: bool = False) -> "ZmqComm":
        """Phase 2: connect to every rank's address (``addresses[rank]`` must be ours)."""
        if not isinstance(addresses, (list, tuple)) or not all(isinstance(a, str) for a in addresses):
            raise TypeError("addresses must be a list of address strings, one per rank")
        if not (isinstance(rank, int) and 0 <= rank < len(addresses)):
            raise ValueError(f"rank must be in 0..{len(addresses) - 1}, got {rank!r}")
        if addresses[rank] != self.address:
            raise ValueError(f"addresses[{rank}] is {addresses[rank]!r} but this endpoint is bound "
                             f"to {self.address!r}: the list must be in rank order")
        return ZmqComm(self, rank, list(addresses), timeout=timeout, trace=trace)

    def close(self) -> None:
        self._pull.close(0)
        self._ctx.term()


def bind(interface: str = "127.0.0.1") -> Endpoint:
    """Phase 1 of the setup: bind a receiving socket on ``interface`` (see module doc)."""
    return Endpoint(interface)


class ZmqComm(QueuedComm):
    """One rank talking to the others over ZeroMQ; build it with ``bind(...).connect(...)``."""

    def __init__(self, endpoint: Endpoint, rank: int, addresses: list[str], *,
                 timeout: float = 30.0, trace: bool = False):
        super().__init__(rank, len(addresses), timeout=timeout, trace=trace)
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

    def close(self, linger: float | None = None) -> None:
        """Close the sockets; queued outgoing messages get ``linger`` seconds (default: timeout)."""
        if self.closed:
            return
        super().close()
        ms = int(1000 * (self._timeout if linger is None else linger))
        for sock in self._push:
            sock.close(ms)
        self._endpoint.close()

    def _post(self, dest, arr, tag, buffered):
        sock = self._push[dest]
        if arr.nbytes <= frames.INLINE_MAX:
            sock.send(frames.encode(arr, tag, self.rank, inline=True), copy=True)
            return None
        sock.send(frames.encode(arr, tag, self.rank), zmq.SNDMORE)
        tracker = sock.send(arr, copy=False, track=True)
        if buffered:
            self._complete(tracker, dest, tag, now() + self._timeout)
            return None
        return tracker

    def _complete(self, tracker, dest, tag, deadline):
        if tracker is None:
            return
        try:
            tracker.wait(max(deadline - now(), 0.0))
        except zmq.NotDone:
            raise self._timeout_error(("send", dest, tag), dest, tag) from None

    def _next_header(self, deadline, op, peer, tag):
        sock = self._pull
        if self._rcvtimeo_full != self._timeout:
            # the first wait may take the whole timeout: the call began microseconds ago
            self._set_rcvtimeo(min(math.ceil(self._timeout * 1000), 2**31 - 1))
            self._rcvtimeo_full = self._timeout
        while True:
            try:
                head = sock.recv(copy=False)
                break
            except zmq.Again:
                left = deadline - now()
                if left <= 0:
                    raise self._timeout_error(op, peer, tag) from None
                self._set_rcvtimeo(math.ceil(left * 1000))
                self._rcvtimeo_full = None
        more = head.more
        try:
            header = self._decode(head)
        except CommError:
            self._drain(more)
            raise
        if more == header.inline:
            self._drain(more)
            raise CommError(f"rank {self.rank}: dropped a message from rank {header.source}: "
                            "it must be one inline part or header + payload parts")
        return header, head

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
