"""The Comm protocol: argument checking, tracing, VERBOSE, sendrecv and barrier.

Backends implement three hooks and inherit the public API unchanged:

* ``_post(dest, arr, tag, buffered) -> handle``: start sending the wire array ``arr``.
  When ``buffered`` the caller may reuse ``arr`` as soon as ``_post`` returns (the backend
  copies it or waits until the transport owns the bytes); otherwise ``arr`` must stay
  untouched until ``_complete(handle, ...)`` returns.
* ``_complete(handle, dest, tag, deadline)``: wait for an unbuffered send.
* ``_match(source, tag, out, deadline, op) -> (Header, array)``: the first message that
  matches ``(source, tag)`` in arrival order (MPI's non-overtaking rule), filling ``out``
  when given.

Cost model: a message of n bytes costs about alpha + n * beta; the header adds
16 + 8*ndim bytes, payloads up to ``frames.INLINE_MAX`` bytes travel in the same part.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager

import numpy as np

from coursekit import checks

from . import frames
from .frames import DTYPE_CODE
from .errors import ANY_SOURCE, ANY_TAG, MAX_TAG, CommError, CommTimeout, peer_name, tag_name
from .trace import Message, Trace, describe, now

_package = sys.modules[__package__]
"""``coursekit.comm``, whose ``VERBOSE`` is read at call time (so plain assignment works)."""

BARRIER_TAG = MAX_TAG + 1
"""Internal tags start here (``BARRIER_TAG + round``); ANY_TAG never matches them."""


def matches(header: frames.Header, source: int, tag: int) -> bool:
    """True when a message with ``header`` satisfies ``recv(source, tag)``."""
    if source != ANY_SOURCE and header.source != source:
        return False
    return header.tag == tag if tag != ANY_TAG else header.tag <= MAX_TAG


def recv_target(header: frames.Header, out) -> np.ndarray | None:
    """The C-contiguous array a payload should be written into for ``recv(out=out)``.

    None when ``out`` is None (the backend allocates). Raises ValueError when the message
    does not fit ``out``.
    """
    if out is None:
        return None
    if out.dtype != header.dtype or out.shape != header.shape:
        raise ValueError(
            f"recv(out=...): the message from rank {header.source} (tag {header.tag}) is "
            f"{header.dtype}{header.shape} but out is {out.dtype}{out.shape}; "
            "shapes and dtypes must match exactly")
    if out.flags.c_contiguous:
        return out
    return np.empty(header.shape, header.dtype)


def fill(target: np.ndarray | None, arr: np.ndarray) -> np.ndarray:
    """Copy ``arr`` into ``target`` when there is one; return whichever holds the data."""
    if target is None:
        return arr
    target[...] = arr  # same dtype and shape (recv_target): a third of np.copyto's cost
    return target


def finish(out, arr: np.ndarray) -> np.ndarray:
    """Return the received array: ``out`` (filled) when given, else a writable ``arr``."""
    if out is None:
        return arr if arr.flags.writeable else arr.copy()
    if arr is not out:
        np.copyto(out, arr)
    return out


class Comm:
    """Point-to-point messaging between ``size`` ranks (mpi4py-like names).

    Every blocking call waits at most ``timeout`` seconds and then raises CommTimeout.
    Tracing is one switch on every backend, off by default: ``trace=True`` (or
    ``comm.tracing = True``, or a ``with trace.recording(comm) as messages:`` block)
    records every user message in ``self.trace`` (see ``trace.Message``).
    A Comm belongs to one thread: do not call it from several threads at once.
    """

    _remote_peers: frozenset = frozenset()
    """Ranks whose REMOTE messages (payload left in the sender's memory) this rank reads."""

    def __init__(self, rank: int, size: int, *, timeout: float = 30.0, trace: bool = False):
        size = checks.integer(size, "size", at_least=1, hint=" (the number of ranks: a positive int)")
        rank = checks.integer(rank, "rank", at_least=0, at_most=size - 1)
        self.rank = rank
        self.size = size
        self.timeout = timeout
        self.tracing = bool(trace)
        self.trace: Trace = Trace()  # the newest trace.MAX_MESSAGES messages
        self.closed = False
        self.interrupted: str | None = None  # the operation a KeyboardInterrupt broke off
        self.broken: str | None = None  # the collective an error broke off, and the error
        self._ready = True
        """Open, not interrupted, not broken: the fast argument checks read this one flag,
        which close() and the _mark_* methods clear (a comm never becomes ready again)."""

    @property
    def timeout(self) -> float:
        return self._timeout

    @timeout.setter
    def timeout(self, value: float) -> None:
        self._timeout = checks.real(value, "timeout", above=0, finite=False,
                                    hint=" (a positive number of seconds)")

    @property
    def single_copy_peers(self) -> frozenset:
        """Ranks this rank sends large ``sendrecv`` payloads to by single copy, when the
        backend does it itself (ZmqComm between processes of one host). Empty here: ThreadComm
        ranks share one memory, and MPI picks its own shared-memory transport for ranks on a
        node (MPICH's CH4 shm / CMA), so a notebook can ask every backend the same question."""
        return frozenset()

    @property
    def shared_memory_peers(self) -> frozenset:
        """Ranks (this one included) this rank sends to through a shared-memory lane of
        the backend's own (ZmqComm between processes of one host). Empty here, like
        :attr:`single_copy_peers`."""
        return frozenset()

    def __repr__(self) -> str:
        return f"<{type(self).__name__} rank {self.rank} of {self.size}>"

    # ---- public API -------------------------------------------------------------------
    def send(self, array: np.ndarray, dest: int, tag: int = 0) -> None:
        """Send ``array`` to rank ``dest``; returns once ``array`` may be reused (buffered)."""
        if (type(array) is np.ndarray and type(dest) is int and type(tag) is int and self._ready
                and 0 <= dest < self.size and 0 <= tag <= MAX_TAG
                and array.dtype in DTYPE_CODE and array.flags.c_contiguous):
            arr = array  # the common case, checked cheaply here: it is on every send's path
        else:
            arr = self._check_send(array, dest, tag)
        record = self.tracing or _package.VERBOSE
        t0 = now() if record else 0.0
        try:
            self._post(dest, arr, tag, True)
        except KeyboardInterrupt:
            self._mark_interrupted(("send", dest, tag))
            raise
        if record:
            self._record("send", self.rank, dest, tag, arr, t0)

    def recv(self, source: int = ANY_SOURCE, tag: int = ANY_TAG, out=None) -> np.ndarray:
        """Receive the first message matching ``(source, tag)``; fills and returns ``out`` if given."""
        if not (type(source) is int and type(tag) is int and self._ready
                and -1 <= source < self.size and -1 <= tag <= MAX_TAG
                and (out is None or type(out) is np.ndarray and out.flags.writeable)):
            self._check_recv(source, tag, out)  # the common case (above) is checked cheaply
        t0 = now()
        op = ("recv", source, tag)
        try:
            header, arr = self._match(source, tag, out, t0 + self._timeout, op)
        except KeyboardInterrupt:
            self._mark_interrupted(op)
            raise
        if self.tracing or _package.VERBOSE:
            self._record("recv", header.source, self.rank, header.tag, arr, t0)
        return arr

    def sendrecv(self, sendbuf: np.ndarray, dest: int, source: int = ANY_SOURCE,
                 sendtag: int = 0, recvtag: int = ANY_TAG, out=None) -> np.ndarray:
        """Send ``sendbuf`` to ``dest`` and receive from ``source`` without deadlocking,
        even when the two ranks sendrecv to each other at the same time.

        Mapping to mpi4py, whose third positional argument is ``sendtag``: here it is
        ``source`` (pass tags by name). mpi4py's ``Sendrecv(sendbuf, dest, sendtag,
        recvbuf, source, recvtag)`` is ``comm.sendrecv(sendbuf, dest, source,
        sendtag=sendtag, recvtag=recvtag, out=recvbuf)`` here, which also returns the
        received array.
        """
        arr = self._check_send(sendbuf, dest, sendtag)
        self._check_recv(source, recvtag, out)
        t0 = now()
        deadline = t0 + self._timeout
        op = ("sendrecv", source, recvtag, dest)
        record = self.tracing or _package.VERBOSE
        try:
            handle = self._post(dest, arr, sendtag, False)
            if record:
                self._record("send", self.rank, dest, sendtag, arr, t0)
            t1 = now()
            header, res = self._match(source, recvtag, out, deadline, op)
            if record:
                self._record("recv", header.source, self.rank, header.tag, res, t1)
            self._complete(handle, dest, sendtag, deadline)
        except KeyboardInterrupt:
            self._mark_interrupted(op)
            raise
        return res

    def barrier(self) -> None:
        """Wait until every rank has entered the barrier.

        Dissemination algorithm: ceil(log2 p) rounds of one zero-byte message each, so it
        costs about ceil(log2 p) * alpha. Not recorded in the trace.
        """
        self._check_open()
        deadline = now() + self._timeout
        empty = np.empty(0, np.uint8)
        step, rnd = 1, 0
        with self.collective("barrier"):
            while step < self.size:
                tag = BARRIER_TAG + rnd
                self._post((self.rank + step) % self.size, empty, tag, True)
                self._match((self.rank - step) % self.size, tag, None, deadline, ("barrier",))
                step, rnd = step * 2, rnd + 1

    def close(self) -> None:
        """Release the transport. Further calls raise CommError."""
        self.closed = True
        self._ready = False

    @contextmanager
    def collective(self, name: str):
        """Wrap the messages of one collective operation (every rank takes part) named
        ``name``: if the block raises, the comm refuses every later call.

        A collective that broke off on one rank -- a timeout, a message it could not take,
        a dead peer, a bug -- leaves its peers' messages of that collective in flight; the
        next collective uses the same tags, would match them and could return a wrong sum
        without any error. So the comm is marked ``broken`` and every later call raises
        CommError until it is rebuilt (like after a KeyboardInterrupt, which marks it
        ``interrupted``). The ranks that waited for this one time out in their turn and
        refuse too. Plain ``send``/``recv`` are not wrapped: a ``recv`` that times out
        may be a poll (the parameter server's), and its message is still the one it
        asked for when it comes. ``coursekit.collectives`` wraps every collective's
        messages, the check=True fingerprint exchange included; :meth:`barrier` too.
        """
        try:
            yield
        except KeyboardInterrupt:
            if self.interrupted is None:  # between two messages: no call marked it
                self._mark_interrupted((name,))
            raise
        except BaseException as exc:
            self._mark_broken(name, exc)
            raise

    def _mark_broken(self, name: str, exc: BaseException) -> None:
        """Collective ``name`` broke off with ``exc``: refuse further use (the first
        cause is kept)."""
        if self.broken is None:
            self.broken = f"{name} with {type(exc).__name__}: {exc}"
        self._ready = False

    def _mark_interrupted(self, op: tuple) -> None:
        """A KeyboardInterrupt broke ``op`` off: its peers' messages may still arrive and
        would be matched by the next operation, so every later call raises CommError
        until the comm is rebuilt (``coursekit.comm.reset_comm`` on a cluster)."""
        self.interrupted = describe_op(op)
        self._ready = False

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---- helpers for backends -----------------------------------------------------------
    def _timeout_error(self, op: tuple, peer: int, tag: int) -> CommTimeout:
        """CommTimeout for operation ``op``: ("recv", source, tag), ("send", dest, tag),
        ("sendrecv", source, recvtag, dest) or ("barrier",) (formatted only when raised)."""
        return CommTimeout(f"rank {self.rank}: {describe_op(op)} timed out after "
                           f"{self._timeout:g} s waiting for {peer_name(peer)} (tag {tag_name(tag)})")

    def _decode(self, head) -> frames.Header:
        """Decode a header part; a defect becomes a CommError naming this rank."""
        try:
            header = frames.decode(head, self.size)
        except CommError as exc:
            raise CommError(f"rank {self.rank}: dropped a message: {exc}") from None
        if header.remote and header.source not in self._remote_peers:
            raise CommError(f"rank {self.rank}: dropped a message from rank {header.source}: it "
                            "points into that rank's memory, which this rank cannot read")
        return header

    def _check_open(self) -> None:
        if self.closed:
            raise CommError(f"rank {self.rank}: this {type(self).__name__} is closed")
        if self.interrupted or self.broken:
            what = (f"was interrupted in {self.interrupted}" if self.interrupted else
                    f"broke off {self.broken.removesuffix('.')}")
            raise CommError(
                f"rank {self.rank}: this {type(self).__name__} {what}; messages of that "
                "operation may still arrive and would be taken for the next one's, so it "
                "refuses further use: rebuild it (coursekit.comm.reset_comm(cluster) from "
                "the notebook)")

    def _check_rank(self, value, what: str, wildcard: bool) -> None:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{what} must be an int rank, got {type(value).__name__}")
        if not (0 <= value < self.size or (wildcard and value == ANY_SOURCE)):
            extra = " or ANY_SOURCE" if wildcard else ""
            raise ValueError(f"{what}={value} is not a rank of this comm: "
                             f"allowed 0..{self.size - 1}{extra}")

    def _check_tag(self, value, what: str, wildcard: bool) -> None:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            raise TypeError(f"{what} must be an int, got {type(value).__name__}")
        if not (0 <= value <= MAX_TAG or (wildcard and value == ANY_TAG)):
            extra = " or ANY_TAG" if wildcard else ""
            raise ValueError(f"{what}={value} is out of range: allowed 0..{MAX_TAG}{extra}")

    def _check_send(self, array, dest, tag) -> np.ndarray:
        """The wire array to send; raises on anything ``send`` does not accept."""
        self._check_open()
        self._check_rank(dest, "dest", False)
        self._check_tag(tag, "tag", False)
        return frames.wire_array(array)

    def _check_recv(self, source, tag, out) -> None:
        """Raise on anything ``recv`` does not accept (ANY_SOURCE == ANY_TAG == -1)."""
        self._check_open()
        self._check_rank(source, "source", True)
        self._check_tag(tag, "tag", True)
        if out is not None:
            if not isinstance(out, np.ndarray):
                raise TypeError(f"out must be a NumPy array or None, got {type(out).__name__}")
            if not out.flags.writeable:
                raise ValueError("out is read-only; pass a writable array (e.g. out.copy())")

    def _record(self, op, src, dst, tag, arr, t0) -> None:
        msg = Message(op, int(src), int(dst), int(tag), arr.nbytes, t0, now())
        if self.tracing:
            self.trace.append(msg)
        if _package.VERBOSE:
            print(describe(msg, arr.dtype, arr.shape), flush=True)

    # ---- backend hooks ------------------------------------------------------------------
    def _post(self, dest: int, arr: np.ndarray, tag: int, buffered: bool):
        raise NotImplementedError

    def _complete(self, handle, dest: int, tag: int, deadline: float) -> None:
        raise NotImplementedError

    def _match(self, source: int, tag: int, out, deadline: float, op: str):
        raise NotImplementedError


def describe_op(op: tuple) -> str:
    """``("recv", 0, 3)`` -> ``"recv(source=0, tag=3)"`` for error messages."""
    name, *args = op
    if name == "recv":
        return f"recv(source={_src_name(args[0])}, tag={tag_name(args[1])})"
    if name == "sendrecv":
        return (f"sendrecv(dest={args[2]}, source={_src_name(args[0])}, "
                f"recvtag={tag_name(args[1])})")
    if name == "send":
        return f"send(dest={args[0]}, tag={args[1]})"
    return f"{name}()"


def _src_name(source: int) -> str:
    return "ANY_SOURCE" if source == ANY_SOURCE else str(source)
