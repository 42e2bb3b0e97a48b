"""run_local: run an SPMD function on n ThreadComm ranks in this process."""

from __future__ import annotations

import threading

from .errors import CommError, add_rank
from .thread import ThreadComm

_JOIN_GRACE = 5.0  # seconds a rank may take to notice an abort before we give up on it


def run_local(fn, n: int, *args, timeout: float = 30.0, **kwargs) -> list:
    """Run ``fn(comm, *args, **kwargs)`` on ``n`` ThreadComm ranks; return the results in rank order.

    If a rank raises, every other rank is aborted (its blocked call raises CommError at
    once) and the first exception is re-raised with ``rank r of n`` added to its message.
    ``timeout`` is each comm's timeout in seconds. Ranks trace when asked, as on every
    backend: ``with trace.recording(comm) as messages:`` inside ``fn``, then ``messages()``.
    """
    if not callable(fn):
        raise TypeError(f"run_local needs a function fn(comm, ...), got {type(fn).__name__}")
    comms = ThreadComm.world(n, timeout=timeout)
    results: list = [None] * n
    failures: list[tuple[int, BaseException]] = []
    lock = threading.Lock()

    def body(comm: ThreadComm) -> None:
        try:
            results[comm.rank] = fn(comm, *args, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - reported to the caller below
            with lock:
                failures.append((comm.rank, exc))
            comm.abort(f"rank {comm.rank} failed with {type(exc).__name__}")

    threads = [threading.Thread(target=body, args=(c,), name=f"coursekit-rank-{c.rank}",
                                daemon=True) for c in comms]
    for t in threads:
        t.start()
    try:
        _join(threads, comms[0], timeout)
    except BaseException:  # KeyboardInterrupt in a notebook: stop the ranks, then re-raise
        comms[0].abort("interrupted")
        raise
    if failures:
        rank, exc = _first_cause(failures)
        raise add_rank(exc, rank, n)
    return results


def _join(threads, comm: ThreadComm, timeout: float) -> None:
    """Join every thread; after an abort, give each at most ``timeout + grace`` seconds."""
    for t in threads:
        while t.is_alive():
            t.join(0.1)
            if comm._world.abort_reason is not None:
                t.join(timeout + _JOIN_GRACE)
                if t.is_alive():
                    raise CommError(f"{t.name} did not stop within {timeout + _JOIN_GRACE:g} s "
                                    f"after the world aborted ({comm._world.abort_reason}); "
                                    "it is stuck outside the comm")
                break


def _first_cause(failures):
    """The first failure that is not merely the abort it caused on other ranks."""
    for rank, exc in failures:
        if not (isinstance(exc, CommError) and "aborted:" in str(exc)):
            return rank, exc
    return failures[0]
