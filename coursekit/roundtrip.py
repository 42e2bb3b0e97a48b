"""Chapter 0's first measurement: what one round trip through the cluster costs.

The notebook process sends an array of ``n`` bytes to an engine, which sends
it straight back. With the lecture's model of one message,
``t = l + n / bw`` (latency plus size over bandwidth), a round trip is two
messages, so ``t_rt(n) = 2 l + 2 n / bw``: the intercept of a straight-line
fit is twice the latency, the slope twice the inverse bandwidth.

This path goes through the ipyparallel client and controller, so it is slow
(milliseconds, a few hundred MB/s); chapter 2 builds the engine-to-engine
path the collectives use.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from coursekit import checks


@dataclass(frozen=True)
class RoundTrips:
    """Round-trip times: ``seconds[i, j]`` is repeat ``j`` for ``nbytes[i]``."""

    nbytes: np.ndarray
    seconds: np.ndarray

    @property
    def best(self) -> np.ndarray:
        """Fastest repeat per size: the least disturbed by the rest of the machine."""
        return self.seconds.min(axis=1)


def _echo(array):
    return array


def measure_round_trips(cluster, nbytes=(8, 1 << 10, 1 << 14, 1 << 17, 1 << 20, 1 << 22),
                        repeats: int = 5, rank: int = 0) -> RoundTrips:
    """Time ``repeats`` echo round trips of float64 arrays of each size to one engine."""
    checks.cluster(cluster)
    checks.integer(repeats, "repeats", at_least=1)
    checks.integer(rank, "rank", at_least=0, at_most=cluster.size - 1)
    sizes = checks.real_array(nbytes, "nbytes", at_least=1).ravel()
    if sizes.size == 0 or np.any(sizes != np.round(sizes)):
        raise ValueError(f"nbytes must be whole numbers of bytes >= 1, at least one; got "
                         f"{nbytes!r:.60}")
    sizes = sizes.astype(np.int64)
    checks.fits_in_memory(2 * int(sizes.max()), "nbytes", "the array sent and the one echoed")
    engine = cluster.client[cluster.engine_ids[rank]]
    seconds = np.empty((len(sizes), repeats))
    for i, size in enumerate(sizes):
        payload = np.ones(max(int(size) // 8, 1))
        engine.apply_sync(_echo, payload)  # warm-up: first use of a size allocates
        for j in range(repeats):
            start = time.perf_counter()
            engine.apply_sync(_echo, payload)
            seconds[i, j] = time.perf_counter() - start
    return RoundTrips(sizes, seconds)
