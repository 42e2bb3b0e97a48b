"""PowerSGD: a rank-r approximation of every gradient matrix by one step of power iteration.

Vogels, Karimireddy & Jaggi, "PowerSGD: Practical Low-Rank Gradient Compression for
Distributed Optimization" (NeurIPS 2019), Algorithm 1. For a gradient matrix M (m x n) and
a warm-start Q (n x r) kept from the previous step:

    P = M Q              allreduce (mean over workers)     m r numbers
    P^ = orthonormal basis of P's columns (QR)
    Q = M^T P^           allreduce (mean over workers)     n r numbers
    C(M) = P^ Q^T        (and Q is the warm start of the next step)

Bytes on the wire: (m + n) r s per matrix instead of m n s (s the itemsize), sent in two
allreduces (P is linear in M for a fixed Q, so the mean of the P's is the P of the mean).
Elements outside every matrix (an MLP's biases) travel uncompressed with P. Biased;
PowerSGD is meant to run with error feedback (:mod:`.memory`). At full rank
r = min(m, n) it is exact: P^ P^T M = M. What this worker contributed ("sent", for the
memory) is P^ Q_w^T with its own Q_w, whose mean over workers is C(M).
"""

from __future__ import annotations

import numpy as np

from coursekit import checks

from .base import Compressed, check_gradient

MAX_RANK = 1 << 20


class PowerSGD:
    """Rank-``rank`` PowerSGD on the matrices of a gradient (a 2-D array, or ``matrices``).

    ``matrices``: (start, rows, cols) of each matrix inside the flat gradient, e.g.
    :meth:`for_mlp`; without it the gradient must be one 2-D matrix. ``seed``: the warm
    start's initial Q, which must be the same on every rank.
    """

    collective = "powersgd"
    unbiased = False
    name = "powersgd"

    def __init__(self, rank: int = 2, matrices=None, *, seed: int = 0):
        self.rank = checks.integer(rank, "rank", 1, MAX_RANK)
        self.matrices = None if matrices is None else self._check_matrices(matrices)
        self.seed = checks.integer(seed, "seed", 0, 2**63 - 1)
        self._warm: dict[int, np.ndarray] = {}

    @classmethod
    def for_mlp(cls, sizes, rank: int = 2, *, seed: int = 0) -> "PowerSGD":
        """Compress every weight matrix W of an MLP with these layer sizes; biases stay dense."""
        from coursekit.nn.layout import check_fits, layer_slices

        check_fits(sizes, 4)  # the float32 gradient it compresses
        return cls(rank, [(s.start, s.n_in, s.n_out) for s in layer_slices(sizes)], seed=seed)

    def _check_matrices(self, matrices):
        spec, end = [], 0
        for item in matrices:
            start, rows, cols = (checks.integer(v, "matrix (start, rows, cols)", 0, 2**62)
                                 for v in item)
            if start < end or rows < 1 or cols < 1:
                raise ValueError(f"matrices must be non-empty and in increasing, "
                                 f"non-overlapping order; got {list(matrices)}")
            if self.rank > min(rows, cols):
                raise ValueError(f"rank={self.rank} is larger than a {rows} x {cols} matrix "
                                 f"allows (at most min(rows, cols) = {min(rows, cols)})")
            spec.append((start, rows, cols))
            end = start + rows * cols
        if not spec:
            raise ValueError("matrices is empty: PowerSGD needs at least one matrix")
        return spec

    # ---- layout -------------------------------------------------------------------------
    def _layout(self, x: np.ndarray):
        """The (start, rows, cols) of every matrix of x and the mask of the other elements."""
        if self.matrices is None:
            if x.ndim != 2:
                raise ValueError(f"PowerSGD needs a 2-D gradient (or matrices=...); got shape "
                                 f"{x.shape}")
            spec = self._check_matrices([(0, *x.shape)])
        else:
            spec = self.matrices
            end = spec[-1][0] + spec[-1][1] * spec[-1][2]
            if end > x.size:
                raise ValueError(f"the matrices reach element {end} but the gradient has "
                                 f"only {x.size}")
        dense = np.ones(x.size, bool)
        for start, rows, cols in spec:
            dense[start:start + rows * cols] = False
        return spec, dense

    def _start(self, i: int, cols: int, dtype) -> np.ndarray:
        q = self._warm.get(i)
        if q is None or q.shape != (cols, self.rank):
            q = np.random.default_rng([self.seed, i]).standard_normal((cols, self.rank))
        return q.astype(dtype, copy=False)

    # ---- the two rounds -----------------------------------------------------------------
    def rounds(self, x, average):
        """Run both rounds with ``average`` (array -> its mean over workers) between them.

        Returns (C, sent, nbytes): the decompressed mean, this worker's own contribution
        (the same shape and dtype as x), and the bytes of the two arrays averaged.
        """
        x = check_gradient(x)
        spec, dense = self._layout(x)
        flat = x.ravel()
        ms = [flat[s:s + r * c].reshape(r, c) for s, r, c in spec]
        qs = [self._start(i, m.shape[1], x.dtype) for i, m in enumerate(ms)]
        first = np.concatenate([(m @ q).ravel() for m, q in zip(ms, qs)] + [flat[dense]])
        first_mean = average(first)
        ps = [np.linalg.qr(p)[0] for p in self._pieces(first_mean, spec, rows=True)]
        second = np.concatenate([(m.T @ p).ravel() for m, p in zip(ms, ps)])
        second_mean = average(second)
        qs_mean = self._pieces(second_mean, spec, rows=False)
        self._warm = dict(enumerate(qs_mean))
        rest = first_mean[first_mean.size - int(dense.sum()):]
        mean = self._assemble(x, spec, dense, ps, qs_mean, rest)
        sent = self._assemble(x, spec, dense, ps, self._pieces(second, spec, rows=False),
                              flat[dense])
        return mean, sent, first.nbytes + second.nbytes

    def _pieces(self, buf, spec, rows: bool):
        """Split a round's array into the (rows x r) P's or the (cols x r) Q's."""
        out, pos = [], 0
        for _, r, c in spec:
            k = (r if rows else c) * self.rank
            out.append(buf[pos:pos + k].reshape(-1, self.rank))
            pos += k
        return out

    def _assemble(self, x, spec, dense, ps, qs, rest):
        out = np.empty(x.size, x.dtype)
        for (s, r, c), p, q in zip(spec, ps, qs):
            out[s:s + r * c] = (p @ q.T).ravel()
        out[dense] = rest
        return out.reshape(x.shape)

    # ---- the Compressor interface, on one worker ----------------------------------------
    def compress(self, x) -> Compressed:
        """One worker's payload: both rounds' arrays, [P's, dense rest] then [Q's].

        Updates the warm start, like a step on one worker.
        """
        rounds = []
        self.rounds(x, lambda a: rounds.append(a) or a)
        return Compressed(np.concatenate(rounds), x.shape, x.dtype)

    def decompress(self, payload: Compressed) -> np.ndarray:
        """P^ Q^T for every matrix (P^ from the QR of the sent P), the rest as sent."""
        if not isinstance(payload, Compressed):
            raise TypeError(f"decompress needs a Compressed payload, got {type(payload).__name__}")
        x = np.empty(payload.shape, payload.dtype)
        spec, dense = self._layout(x)
        n_first = sum(r for _, r, _ in spec) * self.rank + int(dense.sum())
        first, second = payload.data[:n_first], payload.data[n_first:]
        ps = [np.linalg.qr(p)[0] for p in self._pieces(first, spec, rows=True)]
        qs = self._pieces(second, spec, rows=False)
        return self._assemble(x, spec, dense, ps, qs, first[first.size - int(dense.sum()):])

    def __repr__(self) -> str:
        return f"PowerSGD(rank={self.rank}, matrices={self.matrices!r}, seed={self.seed})"
