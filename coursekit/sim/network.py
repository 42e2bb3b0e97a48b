"""The simulated machine: ``nodes`` nodes of ``ranks_per_node`` workers, two link levels.

A message of n bytes between two workers of one node costs ``alpha_intra + n * beta_intra``
(PCIe or NVLink); between nodes it costs ``alpha_inter + n * beta_inter`` (the NIC: Ethernet,
RoCE, InfiniBand). ``gamma`` is the cost per byte of the reduction op (s/B). A node has
``nics_per_node`` NICs: when f workers of one node send across the network at once, each
flow gets ``beta_inter * max(1, f / nics_per_node)`` (they share the NIC bandwidth).
Ranks are numbered node-major: rank r lives on node ``r // ranks_per_node``.
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass, replace

import numpy as np

__all__ = ["Network"]


def positive_int(value, name: str) -> int:
    """``value`` as an int >= 1, else a ValueError naming ``name``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def positive_real(value, name: str, *, zero_ok: bool = False) -> float:
    """``value`` as a finite float > 0 (or >= 0 with ``zero_ok``), else a ValueError."""
    ok = (not isinstance(value, bool) and isinstance(value, numbers.Real)
          and np.isfinite(value) and (value >= 0 if zero_ok else value > 0))
    if not ok:
        bound = ">= 0" if zero_ok else "> 0"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}")
    return float(value)


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
        positive_int(self.ranks_per_node, "ranks_per_node")
        positive_int(self.nodes, "nodes")
        positive_int(self.nics_per_node, "nics_per_node")
        for name in ("alpha_intra", "beta_intra", "alpha_inter", "beta_inter"):
            positive_real(getattr(self, name), name)
        positive_real(self.gamma, "gamma", zero_ok=True)

    @classmethod
    def from_bandwidths(cls, ranks_per_node: int, nodes: int, *, intra_latency: float,
                        intra_bandwidth: float, inter_latency: float, inter_bandwidth: float,
                        reduce_bandwidth: float | None = None,
                        nics_per_node: int = 1) -> "Network":
        """Build from latencies (s) and bandwidths (B/s); ``reduce_bandwidth`` None = free op."""
        bw = {"intra_bandwidth": intra_bandwidth, "inter_bandwidth": inter_bandwidth}
        for name, value in bw.items():
            positive_real(value, name)
        gamma = 0.0 if reduce_bandwidth is None else 1.0 / positive_real(
            reduce_bandwidth, "reduce_bandwidth")
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
        return replace(self, nodes=positive_int(nodes, "nodes"))
