"""Run on the first k ranks of a Comm: a sub-communicator (MPI_Comm_split's simplest case).

The notebook and the benchmark measure 1, 2, 3, 4 workers on one 4-engine cluster
instead of starting a cluster per size. :func:`first_ranks` gives ranks 0..k-1 a Comm of
size k that shares the parent's transport: rank numbers stay the same, so messages need
no translation, and ranks >= k simply take no part. It implements the three backend
hooks of :class:`coursekit.comm.Comm` by delegating to the parent, so tracing, VERBOSE,
timeouts and argument checks are the Comm base class's own.
"""

from __future__ import annotations

from coursekit.comm import Comm

__all__ = ["first_ranks"]


class _Prefix(Comm):
    """Ranks 0..size-1 of ``parent``, as a Comm of ``size`` ranks."""

    def __init__(self, parent: Comm, size: int):
        super().__init__(parent.rank, size, timeout=parent.timeout, trace=parent.tracing)
        self.parent = parent

    def _check_open(self) -> None:
        super()._check_open()
        self.parent._check_open()

    def _post(self, dest, arr, tag, buffered):
        return self.parent._post(dest, arr, tag, buffered)

    def _complete(self, handle, dest, tag, deadline):
        return self.parent._complete(handle, dest, tag, deadline)

    def _match(self, source, tag, out, deadline, op):
        return self.parent._match(source, tag, out, deadline, op)


def first_ranks(comm: Comm, k: int) -> Comm | None:
    """A Comm of ranks 0..k-1 of ``comm`` on those ranks; None on the others.

    Every rank of ``comm`` may call it; only ranks < k get a Comm. ``k == comm.size``
    returns ``comm`` itself. ValueError unless 1 <= k <= comm.size.
    """
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= comm.size:
        raise ValueError(f"the number of workers must be an int in 1..{comm.size} (the ranks "
                         f"of this comm), got {k!r}")
    if k == comm.size:
        return comm
    return _Prefix(comm, k) if comm.rank < k else None
