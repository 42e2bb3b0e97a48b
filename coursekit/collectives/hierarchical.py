"""Hierarchical allreduce: ranks grouped into nodes (Horovod's hierarchical allreduce).

With k ranks on each of m nodes (local rank l = position of a rank inside its node):

1. intra-node ring reduce-scatter: local rank l ends with chunk l of its node's sum;
2. inter-node allreduce of chunk l among the m ranks with local rank l (one per node);
3. intra-node ring allgather: every rank gets all k reduced chunks.

Cost (n = bytes per rank, f(q) = (q-1)/q; intra link i, inter link e):
``2(k-1) alpha_i + 2 f(k) n beta_i + f(k) n gamma``  (phases 1 and 3)
``+ 2(m-1) alpha_e + 2 f(m) (n/k) beta_e + f(m) (n/k) gamma``  (phase 2 with ``inter="ring"``).
Against the flat ring's ``2(p-1) alpha_e + 2 f(p) n beta_e + ...`` it sends the same bytes
through each node's NIC when the k flows of phase 2 share it, but pays 2(m-1) instead of
2(p-1) network latencies: the win at thousands of GPUs and small (or unfused) tensors.
:func:`coursekit.sim.allreduce_time` has the formula as code.

The result equals the flat allreduce up to the order of floating-point additions (exactly,
for integers) and is bit-identical on every rank. Grouping: pass ``ranks_per_node`` (ranks
are node-major: node = rank // ranks_per_node) or ``nodes``, one node label per rank (e.g.
the engines' host names); every node needs the same number of ranks, and every rank must
pass the same grouping.
"""

from __future__ import annotations

import numpy as np

from coursekit import checks
from coursekit.comm.group import subcomm

from ._base import check_comm, chunk_bounds, prepare
from .allgather import ring_allgather
from .allreduce import ALGORITHMS as ALLREDUCE_ALGORITHMS
from .reduce_scatter import ring_reduce_scatter
from .tags import tag

__all__ = ["hierarchical_allreduce", "node_groups"]

_INTRA_RS, _INTER, _INTRA_AG = 4, 4, 5
"""Phases of the allreduce tag block. Intra-node messages only join ranks of one node and
inter-node messages only ranks of different nodes, so phases 1 and 2 may share a tag."""


def node_groups(size: int, *, ranks_per_node=None, nodes=None) -> list[list[int]]:
    """The ranks of every node, nodes in order of first appearance, ranks ascending.

    Exactly one of ``ranks_per_node`` (node-major) and ``nodes`` (a label per rank) is given.
    """
    if (ranks_per_node is None) == (nodes is None):
        raise ValueError("pass exactly one of ranks_per_node= (ranks are node-major) or "
                         "nodes= (one node label per rank, e.g. host names)")
    if ranks_per_node is not None:
        hint = f" (a divisor of the {size} ranks)"
        k = checks.integer(ranks_per_node, "ranks_per_node", at_least=1, hint=hint)
        if size % k:
            raise ValueError(f"ranks_per_node={k} must be a positive divisor of the {size} ranks")
        return [list(range(s, s + k)) for s in range(0, size, k)]
    if isinstance(nodes, str) or not hasattr(nodes, "__iter__"):
        raise TypeError(f"nodes must be a sequence of node labels, one per rank (e.g. host "
                        f"names); got {nodes!r}")
    labels = list(nodes)
    if len(labels) != size:
        raise ValueError(f"nodes has {len(labels)} labels for {size} ranks; give one per rank")
    groups: dict = {}
    for r, label in enumerate(labels):
        groups.setdefault(label, []).append(r)
    counts = {label: len(g) for label, g in groups.items()}
    if len(set(counts.values())) > 1:
        raise ValueError(f"every node needs the same number of ranks; got {counts}")
    return list(groups.values())


def _hierarchical(comm, buf, ufunc, groups, inter_algorithm):
    mine = next(g for g in groups if comm.rank in g)
    local = mine.index(comm.rank)
    intra = subcomm(comm, mine)
    inter = subcomm(comm, [g[local] for g in groups])
    bounds = chunk_bounds(buf.size, len(mine))
    ring_reduce_scatter(intra, buf, bounds, ufunc, tag("allreduce", _INTRA_RS))
    chunk = buf[bounds[local]:bounds[local + 1]]  # a view: reduced in place
    if inter.size > 1 and chunk.size:
        ALLREDUCE_ALGORITHMS[inter_algorithm](inter, chunk, ufunc, tag("allreduce", _INTER))
    return ring_allgather(intra, buf, bounds, tag("allreduce", _INTRA_AG))


def hierarchical_allreduce(comm, x, op: str = "sum", *, ranks_per_node=None, nodes=None,
                           inter: str = "ring", check: bool = True) -> np.ndarray:
    """Allreduce ``x`` in three phases over nodes; returns ``op`` over every rank's ``x``.

    ``inter`` is the inter-node allreduce algorithm (any of
    ``coursekit.collectives.ALGORITHMS["allreduce"]``).
    """
    check_comm(comm)
    groups = node_groups(comm.size, ranks_per_node=ranks_per_node, nodes=nodes)
    if inter not in ALLREDUCE_ALGORITHMS:
        raise ValueError(f"unknown inter-node allreduce algorithm {inter!r}; allowed: "
                         f"{list(ALLREDUCE_ALGORITHMS)}")

    def impl(comm, buf, ufunc, _tag):
        return _hierarchical(comm, buf, ufunc, groups, inter)

    call = prepare(comm, "allreduce", {"hierarchical": impl}, "hierarchical", x, op=op,
                   check=check)
    buf = np.array(call.x, order="C").reshape(-1)
    return call.impl(comm, buf, call.ufunc, None).reshape(call.shape)
