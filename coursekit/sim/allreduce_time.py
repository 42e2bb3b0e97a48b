"""Closed-form allreduce times on a two-level :class:`~coursekit.sim.network.Network`.

n = bytes per worker, p = k * m workers (k per node, m nodes), f(q) = (q - 1) / q. Each
formula is built from :func:`coursekit.costmodel.predict`, phase by phase:

* ``ring`` (flat, ranks in node-major order; Baidu / Horovod / NCCL rings): 2(p-1) steps of
  n/p bytes. Every step waits for the slowest hop, an inter-node hop as soon as m > 1 (one
  flow per NIC: only the last worker of a node sends across):
  ``2(p-1) alpha_e + 2 f(p) n beta_e + f(p) n gamma`` (intra-node link when m = 1).
* ``tree``: the course's ``reduce_bcast`` (binomial reduce to rank 0, binomial broadcast).
  Round j pairs ranks 2^j apart; it costs ``alpha + n beta`` of the slowest pair (inter-node
  once 2^j >= k, sharing the NIC between the node's senders) plus ``n gamma`` in the reduce:
  ``sum_j [2 (alpha_j + n beta_j) + n gamma]`` over ceil(log2 p) rounds. Latency grows like
  log p, bandwidth like n log p: good for small tensors, poor for big ones.
* ``hierarchical`` (Horovod's hierarchical allreduce, NCCL's 2-D rings): intra-node ring
  reduce-scatter, inter-node ring allreduce of n/k bytes among the m workers with the same
  local rank (k flows share the node's NICs), intra-node ring allgather:
  ``2(k-1) alpha_i + 2 f(k) n beta_i + f(k) n gamma`` (the two intra phases)
  ``+ 2(m-1) alpha_e + 2 f(m) (n/k) beta_e * max(1, k/nics) + f(m) (n/k) gamma``.
  Same inter-node bytes per node as the flat ring, but 2(m-1) instead of 2(p-1) latencies.

Jia et al. 2018 ("hybrid allreduce") also reduce to and broadcast from one master per group;
the three-phase form above is the one :mod:`coursekit.collectives.hierarchical` runs.
"""

from __future__ import annotations

import numpy as np

from coursekit import checks, costmodel

from .network import Network

__all__ = ["ALGORITHMS", "allreduce_time", "tree_rounds"]

ALGORITHMS = ("ring", "tree", "hierarchical")


def _ring(net: Network, n):
    if net.nodes == 1:
        a, b = net.alpha_intra, net.beta_intra
    else:
        a, b = net.alpha_inter, net.inter_beta(1)
    return costmodel.predict("allreduce", "ring", net.p, n, a, b, net.gamma)


def tree_rounds(net: Network) -> list[tuple[float, float]]:
    """(alpha, beta) of every round of a binomial tree on ``net``'s node-major ranks."""
    p, rounds, dist = net.p, [], 1
    while dist < p:
        senders = np.arange(dist, p, 2 * dist)  # rank v + dist sends to v in the reduce
        nodes = net.node_of(senders)
        crossing = nodes != net.node_of(senders - dist)
        if crossing.any():
            flows = int(np.bincount(nodes[crossing]).max())
            rounds.append((net.alpha_inter, net.inter_beta(flows)))
        else:
            rounds.append((net.alpha_intra, net.beta_intra))
        dist *= 2
    return rounds


def _tree(net: Network, n):
    return sum(2 * (a + n * b) + n * net.gamma for a, b in tree_rounds(net))


def _hierarchical(net: Network, n):
    k, m = net.ranks_per_node, net.nodes
    intra = (costmodel.predict("reduce_scatter", "ring", k, n, net.alpha_intra,
                               net.beta_intra, net.gamma)
             + costmodel.predict("allgather", "ring", k, n, net.alpha_intra, net.beta_intra))
    inter = costmodel.predict("allreduce", "ring", m, n / k, net.alpha_inter,
                              net.inter_beta(k), net.gamma)
    return intra + inter


_FORMULAS = {"ring": _ring, "tree": _tree, "hierarchical": _hierarchical}


def allreduce_time(net: Network, nbytes, algorithm: str = "ring"):
    """Seconds to allreduce ``nbytes`` (scalar or array) per worker on ``net``."""
    checks.instance(net, "net", Network)
    if algorithm not in _FORMULAS:
        raise ValueError(f"unknown allreduce algorithm {algorithm!r}; allowed: {ALGORITHMS}")
    n = checks.real_array(nbytes, "nbytes", at_least=0)
    if net.p == 1:
        return np.zeros_like(n) if n.ndim else 0.0
    out = _FORMULAS[algorithm](net, n if n.ndim else float(n))
    return out
