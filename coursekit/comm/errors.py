"""Exceptions and wildcard constants shared by every Comm backend."""

ANY_SOURCE = -1
"""Wildcard for ``recv(source=...)``: match a message from any rank."""

ANY_TAG = -1
"""Wildcard for ``recv(tag=...)``: match any user tag (never an internal one)."""

MAX_TAG = 32767
"""Largest user tag. 32767 is the smallest upper bound the MPI standard guarantees
(``MPI_TAG_UB``), so programs that run on ThreadComm run unchanged on MpiComm."""


class CommError(RuntimeError):
    """A communication failed: malformed frame, aborted world, closed comm, dead peer."""


class CommTimeout(CommError, TimeoutError):
    """A blocking call waited longer than the comm's ``timeout``.

    The message names the rank that waited, the peer it waited for, the tag and the
    operation, e.g. ``rank 1: recv(source=0, tag=3) timed out after 2 s waiting for rank 0``.
    """


class PeerGone(CommTimeout):
    """A blocking call waited for a rank whose process has ended, so what it waited for
    can never come. Raised as soon as that is known (for a peer on this host, within
    ``coursekit.comm.shm.PEER_CHECK_S``) instead of after the whole ``timeout``; a
    CommTimeout, so code that gives up on a silent peer gives up on a dead one sooner.

    The message names the rank that waited, the dead peer and the operation, e.g.
    ``rank 0: recv(source=1, tag=2) stopped waiting for rank 1 (tag 2): its process has
    exited, and no message it sent before is left to match``.
    """


def peer_name(peer: int) -> str:
    """Human-readable peer for error messages (``ANY_SOURCE`` becomes 'any rank')."""
    return "any rank" if peer == ANY_SOURCE else f"rank {peer}"


def tag_name(tag: int) -> str:
    return "ANY_TAG" if tag == ANY_TAG else str(tag)


def add_rank(exc: BaseException, rank: int, n: int) -> BaseException:
    """Put ``[rank r of n]`` in front of ``exc``'s message (unless it names the rank) and return it."""
    where = f"[rank {rank} of {n}]"
    if exc.args and isinstance(exc.args[0], str):
        if not exc.args[0].startswith(f"rank {rank}:"):  # Comm errors already name it
            exc.args = (f"{where} {exc.args[0]}",) + exc.args[1:]
    else:
        exc.add_note(where)
    return exc
