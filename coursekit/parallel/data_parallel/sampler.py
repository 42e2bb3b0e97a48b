"""Which rows each worker reads at each step: the serial order, split across workers.

Serial SGD (:func:`coursekit.nn.train`) draws one permutation of the n rows per epoch from
``np.random.default_rng(seed)`` and takes consecutive batches of B rows (the last one
smaller when B does not divide n). Data parallelism keeps exactly that order and hands
the k-th part of ``np.array_split(batch, N)`` to worker k, so the N local batches
concatenated in rank order ARE the serial batch: every worker draws the same
permutations from the same seed, no communication needed. (PyTorch's DistributedSampler
does the same with a strided split.)

With n_k rows on worker k and the loss a mean over the batch, the serial gradient is

    g = (1/B) sum_i grad l_i = sum_k (n_k / B) g_k,     g_k = (1/n_k) sum_{i in k} grad l_i

so each worker weights its local mean gradient by n_k / B before the sum-allreduce (all
weights are 1/N when N divides B). A worker may get no rows in a short last batch: its
weight is 0 and it contributes zeros.
"""

from __future__ import annotations

import numpy as np

__all__ = ["Sampler"]


class Sampler:
    """The rows of step t for worker k of N; its state is part of every checkpoint."""

    def __init__(self, n_rows: int, batch_size: int, seed):
        self.n_rows, self.batch_size = int(n_rows), int(batch_size)
        self.steps_per_epoch = -(-self.n_rows // self.batch_size)
        self.rng = np.random.default_rng(seed)
        self.epoch = -1
        self.permutation = np.empty(0, np.int64)

    def _ensure_epoch(self, epoch: int) -> None:
        if epoch < self.epoch:
            raise ValueError(f"the sampler is at epoch {self.epoch}; it cannot go back to {epoch}")
        while self.epoch < epoch:
            self.permutation = self.rng.permutation(self.n_rows)
            self.epoch += 1

    def batch(self, step: int) -> np.ndarray:
        """The global batch of ``step`` (row indices, serial order)."""
        epoch, j = divmod(step, self.steps_per_epoch)
        self._ensure_epoch(epoch)
        return self.permutation[j * self.batch_size:(j + 1) * self.batch_size]

    def local(self, step: int, rank: int, size: int) -> tuple[np.ndarray, float]:
        """(this worker's rows, its weight n_k / B) at ``step``."""
        batch = self.batch(step)
        mine = np.array_split(batch, size)[rank]
        return mine, len(mine) / len(batch)

    def state(self) -> tuple[dict, np.ndarray, int]:
        """(generator state after the current epoch's permutation, that permutation, epoch)."""
        return self.rng.bit_generator.state, self.permutation.copy(), self.epoch

    def restore(self, rng_state: dict, permutation: np.ndarray, epoch: int) -> None:
        self.rng.bit_generator.state = rng_state
        self.permutation = np.asarray(permutation, np.int64)
        self.epoch = int(epoch)
