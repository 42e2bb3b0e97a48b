"""Tag/source matching for transports that deliver messages in arrival order.

ThreadComm and ZmqComm read whole messages from one incoming stream (a queue, a socket).
A message nobody asked for yet is kept in ``self._unmatched``; ``recv`` first looks there,
then reads the stream until a match arrives. Messages from one sender travel over one
FIFO stream, so messages between the same pair with the same tag never overtake each
other. Matching costs O(k) for k buffered unmatched messages (k is small in practice).

Backends implement two hooks:

* ``_next_header(deadline, op, peer, tag) -> (Header, first part)``: block
  until a message arrives; raise CommTimeout (built by ``_timeout_error``) at the deadline
  and CommError for a malformed frame after discarding it completely. An INLINE first
  part holds exactly the payload its header announces (``frames.decode`` checks that).
* ``_read_payload(header, target) -> array``: read the separate payload part of the
  message just announced, into ``target`` when it is not None.

and may override how a message nobody asked for yet is kept: ``_park(header, head)``
returns what ``_unmatched`` holds (default: its payload, read now), ``_unpark(header,
parked, target)`` the payload when a ``recv`` takes it (written into ``target`` when not
None). ZmqComm parks a single-copy message unread, so that it is copied once, straight
into the ``out`` of the ``recv`` that takes it.
"""

from __future__ import annotations

import numpy as np

from . import frames
from .base import Comm, fill, finish, matches, recv_target
from .errors import ANY_SOURCE, ANY_TAG, MAX_TAG


class QueuedComm(Comm):
    def __init__(self, rank: int, size: int, **kw):
        super().__init__(rank, size, **kw)
        self._unmatched: list[tuple[frames.Header, object]] = []  # what _park kept

    def _match(self, source, tag, out, deadline, op):
        for i, (header, parked) in enumerate(self._unmatched) if self._unmatched else ():
            if matches(header, source, tag):
                del self._unmatched[i]  # consumed even if it does not fit ``out``
                try:
                    target = recv_target(header, out)
                except ValueError:
                    self._unpark(header, parked, None)  # consume it: the message is dropped
                    raise
                return header, finish(out, self._unpark(header, parked, target))
        while True:
            header, head = self._next_header(deadline, op, source, tag)
            if not ((source == ANY_SOURCE or header.source == source)  # matches(), inlined
                    and (header.tag == tag if tag != ANY_TAG else header.tag <= MAX_TAG)):
                self._unmatched.append((header, self._park(header, head)))
                continue
            if header.inline and out is not None and out.dtype is header.dtype \
                    and out.shape == header.shape:  # the common case, taken cheaply:
                try:  # the payload's bytes straight into out's (their lengths match: see above)
                    out.data.cast("B")[:] = memoryview(head)[header.size:]
                except TypeError:  # out is not C-contiguous, or empty: NumPy copies
                    out[...] = np.ndarray(header.shape, header.dtype, head, header.size)
                return header, out
            try:
                target = recv_target(header, out)
            except ValueError:
                self._payload(header, head, None)  # consume it: the message is dropped
                raise
            return header, finish(out, self._payload(header, head, target))

    def _park(self, header, head):
        """What ``_unmatched`` keeps of a message no ``recv`` asked for yet: its payload."""
        return self._payload(header, head, None)

    def _unpark(self, header, parked, target) -> np.ndarray:
        """The payload of a parked message, written into ``target`` when not None."""
        return parked if target is None else fill(target, parked)

    def _payload(self, header, head, target) -> np.ndarray:
        if not header.inline:
            return self._read_payload(header, target)
        return fill(target, frames.to_array(header, head, header.size))

    def _next_header(self, deadline, op, peer, tag):
        raise NotImplementedError

    def _read_payload(self, header, target):
        raise NotImplementedError

