"""One synchronous data-parallel training step, simulated: backward pass, buckets, overlap.

A :class:`Workload` lists the gradient tensors in the order the backward pass produces
them (last layer first) with the backward compute that precedes each. The step:

1. forward ``t_f`` and backward; tensor i is ready at ``t_f + sum_{j<=i} t_b[j]``;
2. tensor fusion (Horovod) / gradient buckets (PyTorch DDP): ready tensors are packed in
   order into buckets of at least ``fusion_bytes`` (0: one allreduce per tensor; ``inf``:
   one allreduce of the whole gradient). A bucket is ready with its last tensor;
3. one communication stream: bucket b's allreduce starts at
   ``max(ready_b, end_{b-1})`` with ``overlap`` (DDP / Horovod), or after the whole backward
   without it, and lasts ``launch + allreduce_time(bytes_b)`` (FP16 gradients halve bytes,
   and the buckets are filled with the halved bytes: the threshold applies to what is sent);
4. the update (``t_u``) follows the last allreduce.

Stragglers: worker w computes ``s_w`` times slower (``s_w >= 1``); a synchronous allreduce
waits for the slowest, so with one factor per worker and step every ready time scales by
``max_w s_w`` (the max of p draws grows with p: stragglers hurt more at scale). All of this is
O(tensors + p) with NumPy, so a 2048-worker ResNet-50 step takes well under a millisecond.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coursekit import checks
from coursekit.parallel.spans import Span

from .allreduce_time import ALGORITHMS, allreduce_time
from .network import Network

__all__ = ["StepResult", "Stragglers", "Workload", "buckets", "scaling", "simulate_step"]


@dataclass(frozen=True)
class Workload:
    """Per-worker work of one step. Arrays are in backward order (first ready first).

    ``grad_bytes[i]``: FP32 bytes of gradient tensor i; ``backward_s[i]``: backward compute
    finished just before tensor i is ready; ``forward_s``, ``update_s``: seconds;
    ``batch``: samples per worker per step.
    """

    name: str
    grad_bytes: np.ndarray
    backward_s: np.ndarray
    forward_s: float
    update_s: float
    batch: int

    def __post_init__(self):
        g = checks.real_array(self.grad_bytes, "grad_bytes", above=0)
        b = checks.real_array(self.backward_s, "backward_s", at_least=0)
        if g.ndim != 1 or g.shape != b.shape or g.size == 0:
            raise ValueError(f"grad_bytes and backward_s need the same non-empty 1-D shape; "
                             f"got {g.shape} and {b.shape}")
        object.__setattr__(self, "grad_bytes", g)
        object.__setattr__(self, "backward_s", b)
        checks.real(self.forward_s, "forward_s", at_least=0)
        checks.real(self.update_s, "update_s", at_least=0)
        checks.integer(self.batch, "batch", at_least=1)

    @property
    def compute_s(self) -> float:
        """Forward + backward + update of one worker, no communication."""
        return self.forward_s + float(self.backward_s.sum()) + self.update_s

    def scaled(self, batch: int) -> "Workload":
        """The same model at another per-worker batch: compute scales linearly."""
        f = checks.integer(batch, "batch", at_least=1) / self.batch
        return Workload(self.name, self.grad_bytes, self.backward_s * f, self.forward_s * f,
                        self.update_s, batch)


@dataclass(frozen=True)
class Stragglers:
    """Per-worker slowdown factors: each worker is slow with probability ``fraction``
    (then ``slowdown`` times slower), and every worker jitters by a lognormal(0, ``jitter``)
    factor >= 1. ``factors(p)`` is reproducible from ``seed``."""

    fraction: float = 0.0
    slowdown: float = 1.0
    jitter: float = 0.0
    seed: int = 0

    def __post_init__(self):
        checks.real(self.fraction, "fraction", at_least=0, at_most=1)
        checks.real(self.slowdown, "slowdown", at_least=1, hint=" (a factor on compute time)")
        checks.real(self.jitter, "jitter", at_least=0)
        checks.integer(self.seed, "seed", at_least=0)

    def factors(self, p: int) -> np.ndarray:
        rng = np.random.default_rng(self.seed)
        slow = rng.random(p) < self.fraction
        jitter = np.exp(np.abs(rng.normal(0.0, self.jitter, p))) if self.jitter else np.ones(p)
        return np.where(slow, self.slowdown, 1.0) * jitter


def buckets(grad_bytes, fusion_bytes: float) -> np.ndarray:
    """Index of the last tensor of every bucket (tensors packed in order, >= fusion_bytes)."""
    checks.real(fusion_bytes, "fusion_bytes", at_least=0, finite=False,
                hint=" (0: no fusion; inf: one bucket)")
    g = checks.real_array(grad_bytes, "grad_bytes", above=0)
    if fusion_bytes == 0:
        return np.arange(g.size)
    ends, filled = [], 0.0
    for i, nbytes in enumerate(g):
        filled += nbytes
        if filled >= fusion_bytes:
            ends.append(i)
            filled = 0.0
    if not ends or ends[-1] != g.size - 1:
        ends.append(g.size - 1)
    return np.array(ends)


@dataclass(frozen=True)
class StepResult:
    """Times in seconds. ``bucket_*`` arrays have one entry per allreduce."""

    p: int
    step_s: float
    compute_s: float
    forward_end_s: float
    backward_end_s: float
    update_s: float
    comm_s: float
    bucket_bytes: np.ndarray
    bucket_ready_s: np.ndarray
    bucket_start_s: np.ndarray
    bucket_end_s: np.ndarray
    samples: int

    @property
    def exposed_comm_s(self) -> float:
        """Step time not covered by (the slowest worker's) computation."""
        return self.step_s - self.compute_s

    @property
    def throughput(self) -> float:
        """Samples per second of the whole job."""
        return self.samples / self.step_s

    def spans(self) -> list[Span]:
        """The step of a worker (every worker's is alike) as Spans on two rows, whose
        ``rank`` is the row: 0 its compute, 1 its allreduces (which overlap the backward)."""
        bars = [Span(0, "forward", 0.0, self.forward_end_s),
                Span(0, "backward", self.forward_end_s, self.backward_end_s),
                Span(0, "optimizer", self.step_s - self.update_s, self.step_s)]
        bars += [Span(1, "comm", a, b) for a, b in zip(self.bucket_start_s, self.bucket_end_s)]
        return bars


def simulate_step(work: Workload, net: Network, *, algorithm: str = "ring",
                  fusion_bytes: float = 64 * 2**20, overlap: bool = True, fp16: bool = False,
                  launch_s: float = 0.0, stragglers: Stragglers | None = None) -> StepResult:
    """Simulate one step of ``work`` on every worker of ``net`` (see the module docstring)."""
    checks.instance(work, "work", Workload)
    checks.instance(net, "net", Network)
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown allreduce algorithm {algorithm!r}; allowed: {ALGORITHMS}")
    checks.real(launch_s, "launch_s", at_least=0)
    checks.boolean(overlap, "overlap")
    checks.boolean(fp16, "fp16")
    if stragglers is not None:
        checks.instance(stragglers, "stragglers", Stragglers, " or None")
    slow = float(stragglers.factors(net.p).max()) if stragglers else 1.0
    ready = slow * (work.forward_s + np.cumsum(work.backward_s))
    # fp16: half the bytes on the wire; the fusion threshold applies to the bytes sent (Horovod
    # fills its fusion buffer with the fp16 tensors it will allreduce)
    sent = work.grad_bytes / 2 if fp16 else work.grad_bytes
    ends = buckets(sent, fusion_bytes)
    sizes = np.diff(np.concatenate([[0.0], np.cumsum(sent)[ends]]))
    durations = launch_s + np.asarray(allreduce_time(net, sizes, algorithm)) * (net.p > 1)
    bucket_ready = ready[ends] if overlap else np.full(ends.size, ready[-1])
    start, end = np.empty(ends.size), np.empty(ends.size)
    free = 0.0
    for b in range(ends.size):  # one communication stream: buckets go one after the other
        start[b] = max(bucket_ready[b], free)
        end[b] = free = start[b] + durations[b]
    update = slow * work.update_s
    step = max(end[-1], ready[-1]) + update
    return StepResult(net.p, step, ready[-1] + update, slow * work.forward_s, ready[-1], update,
                      float(durations.sum()), sizes, bucket_ready, start, end,
                      net.p * work.batch)


def scaling(work: Workload, net: Network, nodes, **options) -> dict:
    """Throughput and efficiency for every node count in ``nodes`` (other options as in
    :func:`simulate_step`). Efficiency = throughput / (p x one worker without communication)."""
    if isinstance(nodes, str) or not hasattr(nodes, "__iter__"):
        raise TypeError(f"nodes must be a sequence of node counts, e.g. [1, 2, 4, 8]; got "
                        f"{nodes!r}")
    counts = [checks.integer(m, "nodes", at_least=1) for m in nodes]
    steps = [simulate_step(work, net.with_nodes(m), **options) for m in counts]
    gpus = np.array([s.p for s in steps])
    throughput = np.array([s.throughput for s in steps])
    ideal = gpus * work.batch / work.compute_s
    return {"gpus": gpus, "throughput": throughput, "efficiency": throughput / ideal,
            "step_s": np.array([s.step_s for s in steps]),
            "exposed_comm_s": np.array([s.exposed_comm_s for s in steps])}
