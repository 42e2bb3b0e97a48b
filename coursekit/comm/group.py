"""Sub-communicators: some ranks of a Comm seen as a Comm of their own (MPI_Comm_split).

``subcomm(comm, members)`` gives every member a Comm whose rank i is parent rank
``members[i]``; it shares the parent's transport (no new sockets), translating ranks on
the way in and out, so VERBOSE, timeouts, argument checks and the barrier are the
:class:`~coursekit.comm.Comm` base class's own. Its messages are traced in the parent's
``trace`` (with parent ranks), so a timeline of the parent shows the group's traffic. Uses in the course: running 1, 2, 3, 4
workers on one 4-engine cluster (:func:`first_ranks`), and the intra-node / inter-node
groups of the hierarchical allreduce.

Messages carry parent ranks on the wire, so a group must not share tags with traffic
between the same ranks outside it. ``ANY_SOURCE`` in a group that is not the whole
parent matches a message from any parent rank; one from a non-member raises CommError.
"""

from __future__ import annotations

from coursekit import checks

from .base import Comm
from .errors import ANY_SOURCE, CommError

__all__ = ["SubComm", "first_ranks", "subcomm"]


class SubComm(Comm):
    """Parent ranks ``members`` as a Comm: group rank i is ``members[i]``."""

    def __init__(self, parent: Comm, members: list[int]):
        # not Comm.__init__: tracing and the trace belong to the parent
        self.parent = parent
        self.members = members
        self._group_rank = {p: g for g, p in enumerate(members)}
        self.rank, self.size = members.index(parent.rank), len(members)
        self.timeout = parent.timeout
        self.closed = False
        self.interrupted = None
        self.broken = None
        self._ready = True

    @property
    def _ready(self) -> bool:
        """This group's own flag (Comm._ready) and the parent's: the parent may be closed,
        interrupted or broken by traffic outside the group."""
        return self._own_ready and self.parent._ready

    @_ready.setter
    def _ready(self, ready: bool) -> None:
        self._own_ready = ready

    def _mark_interrupted(self, op: tuple) -> None:
        super()._mark_interrupted(op)
        self.parent._mark_interrupted(op)  # the parent's stream holds the stale messages

    def _mark_broken(self, name: str, exc: BaseException) -> None:
        super()._mark_broken(name, exc)
        self.parent._mark_broken(name, exc)  # the same: the parent must refuse too

    tracing = property(lambda self: self.parent.tracing,
                       lambda self, on: setattr(self.parent, "tracing", on))
    trace = property(lambda self: self.parent.trace)

    def _record(self, op, src, dst, tag, arr, t0) -> None:
        self.parent._record(op, self.members[src], self.members[dst], tag, arr, t0)

    @property
    def single_copy_peers(self) -> frozenset:
        return self._members_of(self.parent.single_copy_peers)

    @property
    def shared_memory_peers(self) -> frozenset:
        return self._members_of(self.parent.shared_memory_peers)

    def _members_of(self, parent_ranks) -> frozenset:
        """The group ranks of those of ``parent_ranks`` that are members."""
        return frozenset(self._group_rank[p] for p in parent_ranks if p in self._group_rank)

    def __repr__(self) -> str:
        return f"<SubComm rank {self.rank} of {self.size}: ranks {self.members} of {self.parent!r}>"

    def _check_open(self) -> None:
        super()._check_open()
        self.parent._check_open()

    def _post(self, dest, arr, tag, buffered):
        return self.parent._post(self.members[dest], arr, tag, buffered)

    def _complete(self, handle, dest, tag, deadline):
        return self.parent._complete(handle, self.members[dest], tag, deadline)

    def _match(self, source, tag, out, deadline, op):
        parent_source = source if source == ANY_SOURCE else self.members[source]
        header, arr = self.parent._match(parent_source, tag, out, deadline, op)
        if header.source not in self._group_rank:
            raise CommError(f"rank {self.rank}: {op[0]} on a group of ranks {self.members} got "
                            f"a message from rank {header.source}, which is not in the group")
        return header._replace(source=self._group_rank[header.source]), arr


def subcomm(comm: Comm, members) -> Comm | None:
    """The group ``members`` (parent ranks, in group-rank order) on its members; None elsewhere.

    Every rank may call it; ``members`` equal to all ranks in order returns ``comm`` itself.
    TypeError for a rank that is not an integer (1.5 is not rank 1), ValueError for repeated
    or out-of-range ranks (:func:`coursekit.checks.rank_list`).
    """
    members = checks.rank_list(members, "members", comm.size)
    if members == list(range(comm.size)):
        return comm
    return SubComm(comm, members) if comm.rank in members else None


def first_ranks(comm: Comm, k: int) -> Comm | None:
    """A Comm of ranks 0..k-1 of ``comm`` on those ranks; None on the others.

    TypeError unless an integer, ValueError unless 1 <= k <= comm.size.
    """
    if not 1 <= checks.integer(k, "k", hint=f" in 1..{comm.size} (the number of workers)") \
            <= comm.size:
        raise ValueError(f"the number of workers must be an int in 1..{comm.size} (the ranks "
                         f"of this comm), got k={k!r}")
    return subcomm(comm, range(k))
