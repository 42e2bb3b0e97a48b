"""Sparsification: send only some elements (the lecture's second way to shrink a message).

A sparse payload is k int32 indices then k values in the gradient's dtype:
k (4 + s) bytes, s the itemsize. Payloads are allgathered (sparse vectors from different
workers have different supports, so they cannot be summed on the wire).

==============  ==============================================================  ========
compressor      formula                                                         unbiased
==============  ==============================================================  ========
TopK(ratio)     keep the k = max(1, round(ratio n)) largest |x_i|               no
RandomK(ratio)  keep k uniformly random indices, values scaled by n / k         yes
Threshold(t)    keep every x_i with |x_i| >= t (k depends on the data)          no
==============  ==============================================================  ========

99% sparsity is ratio = 0.01. Without error feedback top-k never sends the many small
coordinates that add up over steps; with it (:mod:`.memory`) they accumulate until they
are large enough to be sent (Stich et al., NeurIPS 2018; Lin et al.'s Deep Gradient
Compression, ICLR 2018). Random-k's variance is (n/k - 1) x_i^2 per element.
"""

from __future__ import annotations

import numpy as np

from coursekit import checks

from .base import INDEX, Compressor, check_ratio, join, split


def keep_count(n: int, ratio: float) -> int:
    """k = max(1, round(ratio n)): how many of n elements a ratio keeps."""
    return max(1, int(round(ratio * n)))


class Sparse(Compressor):
    """Payload = join(indices int32, values); subclasses choose them in ``select``."""

    def select(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(indices, values) to send for the flat gradient x."""
        raise NotImplementedError

    def _compress(self, x):
        if x.size > np.iinfo(INDEX).max:
            raise ValueError(f"{x.size} elements do not fit int32 indices")
        idx, values = self.select(x)
        return join(idx.astype(INDEX), values.astype(x.dtype))

    def _decompress(self, data, n, dtype):
        k = data.size // (INDEX.itemsize + np.dtype(dtype).itemsize)
        idx, values = split(data, (INDEX, k), (dtype, k))
        out = np.zeros(n, dtype)
        out[idx] = values
        return out


class TopK(Sparse):
    """The k = max(1, round(ratio n)) elements of largest magnitude. k (4 + s) bytes; biased."""

    name = "topk"

    def __init__(self, ratio: float = 0.01):
        self.ratio = check_ratio(ratio)

    def select(self, x):
        k = keep_count(x.size, self.ratio)
        idx = np.sort(np.argpartition(np.abs(x), x.size - k)[x.size - k:])
        return idx, x[idx]


class RandomK(Sparse):
    """k uniformly random elements, scaled by n / k: E[C(x)] = x. k (4 + s) bytes; unbiased.

    ``rng``: np.random.Generator (or int seed), one per rank.
    """

    name = "randomk"
    unbiased = True

    def __init__(self, ratio: float = 0.01, *, rng):
        self.ratio = check_ratio(ratio)
        self._rng = checks.rng(rng, "rng")

    def variance_bound(self, n: int) -> float:
        """omega = n / k - 1 (each kept element's variance is (n/k - 1) x_i^2)."""
        return n / keep_count(n, self.ratio) - 1

    def select(self, x):
        k = keep_count(x.size, self.ratio)
        idx = np.sort(self._rng.choice(x.size, size=k, replace=False))
        return idx, x[idx] * (x.size / k)


class Threshold(Sparse):
    """Every element with |x_i| >= threshold (possibly none). k (4 + s) bytes, k data
    dependent; biased."""

    name = "threshold"

    def __init__(self, threshold: float = 0.1):
        self.threshold = checks.real(threshold, "threshold", above=0)

    def select(self, x):
        idx = np.flatnonzero(np.abs(x) >= self.threshold)
        return idx, x[idx]
