"""The simulated machine: ``nodes`` nodes of ``ranks_per_node`` workers, two link levels.

A message of n bytes between two workers of one node costs ``alpha_intra + n * beta_intra``
(PCIe or NVLink); between nodes it costs ``alpha_inter + n * beta_inter`` (the NIC: Ethernet,
RoCE, InfiniBand). ``gamma`` is the cost per byte of the reduction op (s/B). A node has
``nics_per_node`` NICs: when f workers of one node send across the network at once, each
flow gets ``beta_inter * max(1, f / nics_per_node)`` (they share the NIC bandwidth).
Ranks are numbered node-major: rank r lives on node ``r // ranks_per_node``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from coursekit import checks

__all__ = ["MAX_WORKERS", "Network"]

MAX_WORKERS = 1 << 24
"""The most workers a Network may have: the closed forms are O(1), but stragglers draw one
factor per worker and the tree's rounds index every rank (16 M workers take ~1 s)."""


@dataclass(frozen=True)
class Network:
    """Two-level alpha-beta network. alpha in s, beta and gamma in s/B (1/bandwidth)."""

    ranks_per_node: int
    nodes: int
    alpha_intra: float
    beta_intra: float
    alpha_inter: float
    beta_inter: float
    gamma: float = 0.0
    nics_per_node: int = 1

    def __post_init__(self):
        for name in ("ranks_per_node", "nodes", "nics_per_node"):
            checks.integer(getattr(self, name), name, at_least=1)
        if self.p > MAX_WORKERS:
            raise ValueError(f"ranks_per_node x nodes = {self.ranks_per_node} x {self.nodes} "
                             f"workers; allowed at most {MAX_WORKERS}")
        for name in ("alpha_intra", "beta_intra", "alpha_inter", "beta_inter"):
            checks.real(getattr(self, name), name, above=0)
        checks.real(self.gamma, "gamma", at_least=0)

    @classmethod
    def from_bandwidths(cls, ranks_per_node: int, nodes: int, *, intra_latency: float,
                        intra_bandwidth: float, inter_latency: float, inter_bandwidth: float,
                        reduce_bandwidth: float | None = None,
                        nics_per_node: int = 1) -> "Network":
        """Build from latencies (s) and bandwidths (B/s); ``reduce_bandwidth`` None = free op."""
        bw = {"intra_bandwidth": intra_bandwidth, "inter_bandwidth": inter_bandwidth}
        for name, value in bw.items():
            checks.real(value, name, above=0)
        gamma = 0.0 if reduce_bandwidth is None else 1.0 / checks.real(
            reduce_bandwidth, "reduce_bandwidth", above=0)
        return cls(ranks_per_node, nodes, intra_latency, 1.0 / intra_bandwidth, inter_latency,
                   1.0 / inter_bandwidth, gamma, nics_per_node)

    @property
    def p(self) -> int:
        """The number of workers."""
        return self.ranks_per_node * self.nodes

    def node_of(self, ranks):
        """Node index of each rank (node-major numbering)."""
        return np.asarray(ranks) // self.ranks_per_node

    def link(self, src: int, dst: int) -> tuple[float, float]:
        """(alpha, beta) of one message from ``src`` to ``dst`` (no sharing)."""
        if src // self.ranks_per_node == dst // self.ranks_per_node:
            return self.alpha_intra, self.beta_intra
        return self.alpha_inter, self.beta_inter

    def inter_beta(self, flows: int) -> float:
        """beta of one of ``flows`` simultaneous inter-node flows leaving one node."""
        return self.beta_inter * max(1.0, flows / self.nics_per_node)

    def with_nodes(self, nodes: int) -> "Network":
        """The same machine with another number of nodes."""
        return replace(self, nodes=nodes)
