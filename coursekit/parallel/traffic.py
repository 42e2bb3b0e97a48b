"""Bytes each rank sends in one training step of an MLP, by parallelism (chapter 5).

The lesson these formulas carry: **model parallelism communicates activations, data
parallelism communicates weights (their gradients)**. With an MLP of widths
``sizes = [n_0, ..., n_L]``, a batch of N rows, p ranks and ``itemsize`` bytes per number:

* **layer split / pipeline** (``pipeline_bytes``): stage s sends its output activations
  (N x n_boundary) to stage s+1 in the forward pass and its input gradient (N x n_boundary)
  to stage s-1 in the backward pass; the micro-batches add up to N rows whatever the schedule,
  so every schedule sends the same bytes. Only the p-1 boundaries communicate.
* **tensor parallel** (``tensor_parallel_bytes``, Megatron's column/row pairs as in
  :class:`~coursekit.parallel.tensor_parallel.TensorParallelMLP`): one ring allreduce of the
  N x n_out activation after every row-parallel layer (forward) and one of the N x n_in input
  gradient before every column-parallel layer but the first (backward); a ring allreduce of n
  bytes sends 2(p-1)/p n per rank. It grows with N x width per layer.
* **data parallel** (``data_parallel_bytes``): one ring allreduce of the gradient, the size of
  the parameters: 2(p-1)/p x params x itemsize per rank, whatever the batch. It grows with width^2.

The counts are those of our implementations (payloads only, ``check=False``): ring chunks follow
``np.array_split`` (:func:`coursekit.costmodel.traffic`). A collective called with ``check=True``
(the default) also sends (p-1) fingerprints of
:data:`~coursekit.collectives.fingerprint.FINGERPRINT_BYTES` (``fingerprint_bytes``).
"""

from __future__ import annotations

import numpy as np

from coursekit import checks, costmodel
from coursekit.collectives.fingerprint import FINGERPRINT_BYTES

__all__ = ["pipeline_bytes", "tensor_parallel_bytes", "tensor_parallel_collectives",
           "data_parallel_bytes", "fingerprint_bytes"]


def _check(sizes, batch, p, itemsize):
    sizes = [checks.integer(n, "a layer width", at_least=1) for n in sizes]
    if len(sizes) < 2:
        raise ValueError(f"sizes={sizes} needs at least two widths (one layer)")
    return (sizes, checks.integer(batch, "batch", at_least=1), checks.integer(p, "p", at_least=1),
            checks.integer(itemsize, "itemsize", at_least=1))


def pipeline_bytes(sizes, batch: int, p: int, *, chunks: int = 1, itemsize: int = 8) -> np.ndarray:
    """Bytes each of the p ranks sends in one step of a layer split or pipeline (any schedule).

    The ``len(sizes) - 1`` layers split into ``p * chunks`` equal stages, stage s on rank
    s % p (``chunks`` > 1: interleaved). Boundary b (after stage b) carries N x n_b numbers
    forward (sent by stage b's rank) and as many backward (sent by stage b+1's rank).
    """
    sizes, batch, p, itemsize = _check(sizes, batch, p, itemsize)
    chunks = checks.integer(chunks, "chunks", at_least=1)
    n_layers, stages = len(sizes) - 1, p * chunks
    if n_layers % stages:
        raise ValueError(f"{stages} stages (p x chunks) cannot split {n_layers} layers evenly")
    k = n_layers // stages
    sent = np.zeros(p, np.int64)
    for s in range(stages - 1):
        boundary = batch * sizes[(s + 1) * k] * itemsize
        sent[s % p] += boundary  # activations forward
        sent[(s + 1) % p] += boundary  # their gradient backward
    return sent


def tensor_parallel_collectives(sizes) -> list[tuple[str, int]]:
    """The collectives of one tensor-parallel step, as (name, numbers per row): layer l is
    column-parallel for even l, row-parallel for odd l (TensorParallelMLP's pairing)."""
    n_layers = len(sizes) - 1
    calls = [("allreduce", sizes[l + 1]) for l in range(n_layers) if l % 2 == 1]  # forward
    if n_layers % 2 == 1:  # a column-parallel last layer: gather the output slices
        calls.append(("allgather", sizes[-1]))
    calls += [("allreduce", sizes[l]) for l in range(2, n_layers, 2)]  # backward, dC/dA
    return calls


def tensor_parallel_bytes(sizes, batch: int, p: int, *, itemsize: int = 8) -> np.ndarray:
    """Bytes each rank sends in one tensor-parallel step: ring allreduces of N x width
    activations (2(p-1)/p of each per rank), see :func:`tensor_parallel_collectives`."""
    sizes, batch, p, itemsize = _check(sizes, batch, p, itemsize)
    sent = np.zeros(p, np.int64)
    for name, width in tensor_parallel_collectives(sizes):
        nbytes = batch * width * itemsize
        unit = nbytes // p if name == "allgather" else itemsize  # allgather: one rank's share
        sent += costmodel.traffic(name, "ring", p, nbytes, itemsize=unit).nbytes
    return sent


def data_parallel_bytes(n_params: int, p: int, *, itemsize: int = 8) -> np.ndarray:
    """Bytes each rank sends in one ring allreduce of an ``n_params`` gradient
    (about 2(p-1)/p x n_params x itemsize, whatever the batch)."""
    n_params = checks.integer(n_params, "n_params", at_least=1)
    p = checks.integer(p, "p", at_least=1)
    itemsize = checks.integer(itemsize, "itemsize", at_least=1)
    return costmodel.traffic("allreduce", "ring", p, n_params * itemsize, itemsize=itemsize).nbytes


def fingerprint_bytes(n_collectives: int, p: int) -> int:
    """Bytes each rank sends for the argument checks of ``n_collectives`` calls with check=True."""
    return checks.integer(n_collectives, "n_collectives", at_least=0) * (p - 1) * FINGERPRINT_BYTES
