"""Authenticated frames for ZmqComm: a MAC and a sequence number on every message.

A ZmqComm rank's receiving socket is a TCP port; any process that can reach it (another
user's on a shared login node, anyone on the cluster network) could connect and push
frames into a student's training. So every message's first part -- the header, with the
inline payload or the single-copy descriptor -- ends with a 24-byte trailer::

    seq  u64   1, 2, 3, ... per (sender, receiver) pair
    mac  16s   BLAKE2b-128 keyed with the comm's secret, over
               first part || source || dest || seq

The receiver recomputes the MAC with the secret all ranks share and checks that ``seq``
is the next one from that sender: a frame from a process without the secret, one meant
for another rank, or a replayed or reordered one fails with a CommError that names the
address it came from, before anything of the comm's state changes. ZmqComm drops such a
frame and goes on receiving (it counts it in ``comm.rejected``): a frame that is not the
comm's own says nothing about the comm's messages, so it must not break off the call
that happened to read it (see :mod:`coursekit.comm.zmq`). A separate payload part (arrays over ``frames.INLINE_MAX``
bytes) is not hashed: ZeroMQ delivers a multipart message whole from one connection, so
a payload can only arrive behind the authenticated header it was sent with. Hashing it
too would cost ~0.55 ms per MiB here (HMAC-SHA256; BLAKE2b ~1 ms), several times what
the transfer itself costs; what remains open is an attacker *on the wire* between two
hosts rewriting payload bytes in flight (use an encrypted fabric for hostile networks).

Cost per message: one keyed-hash copy + update + digest on <= 8 KiB and 24 bytes more on
the wire (bench/bench_p2p.py measures it: about 2 us at 8 B, nothing visible at 1 MiB).

The secret: :func:`derive_key` turns the cluster's ipyparallel session key (which signs
every ipyparallel message and never crosses the wire) and a fresh public nonce into the
comm's key, so every ``setup_comm`` gets a new key without sending one.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

from . import frames
from .errors import CommError

KEY_MIN = 16
"""A comm key has at least this many bytes (128 bits)."""

TRAILER = struct.Struct("<Q16s")
FRAME_MAX = (frames.HEADER_MIN + 8 * frames.MAX_NDIM
             + max(frames.INLINE_MAX, frames.DESCRIPTOR.size) + TRAILER.size)
"""The longest first part a rank sends; a longer one is refused before it is hashed."""
_ROUTE = struct.Struct("<iiQ")
_SOURCE_AT = 12  # offset of the i32 source rank in a frame header (see frames)


def check_key(key) -> bytes:
    """``key`` as bytes; TypeError/ValueError saying what a key must be."""
    if not isinstance(key, (bytes, bytearray)):
        raise TypeError("key must be bytes: a secret all ranks share, at least "
                        f"{KEY_MIN} bytes (e.g. secrets.token_bytes(32)), got {type(key).__name__}")
    if len(key) < KEY_MIN:
        raise ValueError(f"key must have at least {KEY_MIN} bytes, got {len(key)}")
    return bytes(key)


def derive_key(session_key: bytes, nonce: bytes) -> bytes:
    """The comm key HMAC-SHA256(session_key, "coursekit-comm/" + nonce).

    ``session_key`` is the cluster's ipyparallel key; refuses an empty one (a cluster
    whose messages are not signed cannot give its comm a secret)."""
    if not session_key:
        raise CommError("this cluster's messages are not signed (its ipyparallel session key "
                        "is empty), so its engines share no secret to authenticate their Comm "
                        "frames with; start the cluster with a key (ipyparallel's default)")
    return hmac.digest(bytes(session_key), b"coursekit-comm/" + bytes(nonce), "sha256")


class FrameSealer:
    """Seals the frames one rank sends and opens the frames it receives."""

    def __init__(self, key: bytes, rank: int, size: int):
        self._keyed = hashlib.blake2b(key=check_key(key), digest_size=16)
        self.rank = rank
        self.size = size
        self._sent = [0] * size      # last seq sent to each rank
        self._received = [0] * size  # last seq accepted from each rank

    def _mac(self, body, source: int, dest: int, seq: int) -> bytes:
        h = self._keyed.copy()
        h.update(body)
        h.update(_ROUTE.pack(source, dest, seq))
        return h.digest()

    def seal(self, body: bytes, dest: int) -> bytes:
        """``body`` + trailer, for rank ``dest``."""
        seq = self._sent[dest] = self._sent[dest] + 1
        return body + TRAILER.pack(seq, self._mac(body, self.rank, dest, seq))

    def open(self, frame, sender: str) -> memoryview:
        """The body of a received first part after checking its trailer.

        ``sender`` (the connection's address) goes into the CommError of a frame that
        fails: too short or too long, unknown source, wrong MAC, or not the next ``seq``
        from its source. A frame that fails changes nothing here: the caller may drop it
        and go on receiving.
        """
        view = memoryview(frame).cast("B")
        if view.nbytes < TRAILER.size + _SOURCE_AT + 4:
            raise self._refused(sender, f"a {view.nbytes}-byte frame carries no authentication")
        if view.nbytes > FRAME_MAX:
            raise self._refused(sender, f"a {view.nbytes}-byte first part is longer than any "
                                f"this comm sends ({FRAME_MAX} bytes)")
        body = view[:-TRAILER.size]
        seq, mac = TRAILER.unpack_from(view, body.nbytes)
        (source,) = struct.unpack_from("<i", body, _SOURCE_AT)
        if not 0 <= source < self.size or not hmac.compare_digest(
                mac, self._mac(body, source, self.rank, seq)):
            raise self._refused(sender, "its MAC does not match this comm's key: it was not "
                                "sent by one of this comm's ranks (or not to this rank)")
        expected = self._received[source] + 1
        if seq != expected:
            raise self._refused(sender, f"it is message {seq} from rank {source}, the next one "
                                f"is {expected}: a replayed or reordered frame")
        self._received[source] = seq
        return body

    def _refused(self, sender: str, why: str) -> CommError:
        return CommError(f"rank {self.rank}: dropped a frame from {sender} that failed "
                         f"authentication: {why}")
