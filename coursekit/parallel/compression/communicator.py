"""Communicator: move payloads between ranks and average what they stand for.

:func:`exchange` is one step of compressed gradient averaging on every rank:

1. x = memory.compensate(grad)                      (error feedback, :mod:`.memory`)
2. payload = compressor.compress(x); sent = decompress(payload)
3. by the compressor's ``collective``:
   * "allreduce": sum the payloads with :func:`coursekit.collectives.allreduce` and
     decompress the sum (linear compressors: none, fp16);
   * "allgather": every rank receives every payload (:func:`allgatherv`, a ring that also
     carries payloads of different sizes, e.g. threshold sparsification) and decompresses
     each one, then aggregates them (``compressor.aggregate``: their mean, or signSGD's
     majority vote);
   * "powersgd": two allreduces, of P then of Q (:mod:`.lowrank`);
4. memory.update(x, sent); return the mean over ranks (bit-identical on every rank), or
   for signSGD the majority vote sign(sum of the ranks' signs) (:mod:`.sign`).

The bytes each rank sends follow from the payload sizes alone (:func:`wire_nbytes` uses
:func:`coursekit.costmodel.traffic`), and :func:`predict_seconds` is the cost model's time
for one exchange: compare both with the trace and the clock.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coursekit import costmodel
from coursekit.collectives import allreduce

from .base import Compressed
from .memory import NoMemory

TAG = 600  # allgatherv's message tag (user tags stay below coursekit.collectives.TAG_BASE)
COLLECTIVES = ("allreduce", "allgather", "powersgd")
_SAME = ("every rank must pass a gradient of the same shape and dtype, with the same kind of "
         "compressor")


@dataclass(frozen=True)
class Exchanged:
    """One exchange as seen by one rank.

    ``mean``: the averaged gradient (the same on every rank; for signSGD the majority
    vote, :meth:`.Compressor.aggregate`); ``sent``: this rank's own
    contribution, decompressed; ``payload_nbytes``: the size of this rank's payload
    (what the compressor reports); ``wire_nbytes``: the bytes this rank sent.
    """

    mean: np.ndarray
    sent: np.ndarray
    payload_nbytes: int
    wire_nbytes: int


def allgatherv(comm, data: np.ndarray) -> list[np.ndarray]:
    """Ring allgather of arrays that may differ in size: every rank gets all, in rank order.

    p-1 steps; in step k rank r passes block r-k to rank r+1. Rank r sends every block but
    that of rank r+1: (p-1) alpha + sum(sizes) - size[r+1] bytes, the ring allgather's
    (p-1) alpha + (p-1)/p n beta when the sizes are equal.
    """
    p, r = comm.size, comm.rank
    blocks: list = [None] * p
    blocks[r] = data
    right, left = (r + 1) % p, (r - 1) % p
    for k in range(p - 1):
        s = (r - k) % p
        blocks[(s - 1) % p] = comm.sendrecv(blocks[s], right, source=left, sendtag=TAG,
                                            recvtag=TAG)
    return blocks


def _allreduce(comm, data: np.ndarray, algorithm: str) -> np.ndarray:
    """Sum ``data`` over the ranks; check=False (the sizes are not compared before they move:
    the model counts no fingerprint), so a mismatch shows up as a receive of the wrong size."""
    try:
        return allreduce(comm, data, algorithm=algorithm, check=False)
    except ValueError as err:
        raise ValueError(f"exchange: the ranks' payloads do not match ({err}); {_SAME}") from err


def _allreduce_wire(comm, nbytes: int, itemsize: int, algorithm: str) -> int:
    traffic = costmodel.traffic("allreduce", algorithm, comm.size, nbytes, itemsize=itemsize)
    return int(traffic.nbytes[comm.rank])


def exchange(comm, grad: np.ndarray, compressor, memory=None, *,
             algorithm: str = "ring") -> Exchanged:
    """Compress ``grad`` (with ``memory``'s error feedback), exchange, return the mean.

    ``algorithm``: the allreduce algorithm for "allreduce" and "powersgd" compressors.
    Every rank must call it with the same kind of compressor (one instance per rank).
    """
    memory = NoMemory() if memory is None else memory
    collective = getattr(compressor, "collective", None)
    if collective not in COLLECTIVES:
        raise TypeError(f"{compressor!r} is not a compressor (its collective must be one of "
                        f"{COLLECTIVES})")
    x = memory.compensate(grad)
    p = comm.size
    if collective == "powersgd":
        wire = []

        def average(a):
            wire.append(_allreduce_wire(comm, a.nbytes, a.itemsize, algorithm))
            return _allreduce(comm, a, algorithm) / p

        mean, sent, nbytes = compressor.rounds(x, average)
        memory.update(x, sent)
        return Exchanged(mean, sent, nbytes, sum(wire))
    payload = compressor.compress(x)
    sent = compressor.decompress(payload)
    if collective == "allreduce":
        total = _allreduce(comm, payload.data, algorithm)
        mean = compressor.decompress(Compressed(total, x.shape, x.dtype)) / p
        wire = _allreduce_wire(comm, payload.nbytes, payload.data.itemsize, algorithm)
    else:
        blocks = allgatherv(comm, payload.data)
        parts = []
        for k, block in enumerate(blocks):  # the same order on every rank: bit-identical means
            try:
                parts.append(compressor.decompress(Compressed(block, x.shape, x.dtype)))
            except (ValueError, IndexError) as err:
                raise ValueError(f"exchange: rank {k}'s payload does not fit this rank's gradient "
                                 f"{x.dtype}{x.shape} ({err}); {_SAME}") from err
        mean = compressor.aggregate(parts)
        wire = sum(b.nbytes for b in blocks) - blocks[(comm.rank + 1) % p].nbytes if p > 1 else 0
    memory.update(x, sent)
    return Exchanged(mean, sent, payload.nbytes, int(wire))


def predict_seconds(collective: str, p: int, payload_nbytes, alpha: float, beta: float, *,
                    algorithm: str = "ring"):
    """The cost model's time (s) of one exchange of ``payload_nbytes`` per rank.

    allreduce: its formula at n = payload; allgather (ring): n = p * payload, the gathered
    total; powersgd: two allreduces of about half the payload each (both rounds cost
    alpha; the model is linear in n, so how the bytes split between them does not matter).
    """
    if collective not in COLLECTIVES:
        raise ValueError(f"collective={collective!r}: allowed {COLLECTIVES}")
    n = np.asarray(payload_nbytes, dtype=float)
    if collective == "allgather":
        return costmodel.predict("allgather", "ring", p, p * n, alpha, beta)
    rounds = 2 if collective == "powersgd" else 1
    return rounds * costmodel.predict("allreduce", algorithm, p, n / rounds, alpha, beta)


def sent_per_rank(collective: str, p: int, payload_nbytes: int, *, itemsize: int = 4,
                  algorithm: str = "ring") -> int:
    """Bytes the busiest rank sends in one exchange of a ``payload_nbytes`` payload per rank.

    allreduce (ring): 2(p-1)/p x payload, about 2 x payload for many ranks: for a float32
    gradient of n elements, about **8n bytes**, whatever p. allgather (ring, equal payloads):
    (p-1) x payload, growing with p: top-k's payload is 8k bytes (a 4-byte index and a 4-byte
    value per kept element), so it sends (p-1) 8k bytes, and 1% top-k (k = n/100) sends as
    much as the dense ring allreduce at p = 100. ``itemsize``: the allreduce's element size.
    Counted by :func:`coursekit.costmodel.traffic` (the chunks of ``np.array_split``).
    """
    if collective == "allreduce":
        t = costmodel.traffic("allreduce", algorithm, p, int(payload_nbytes), itemsize=itemsize)
    elif collective == "allgather":
        t = costmodel.traffic("allgather", "ring", p, p * int(payload_nbytes),
                              itemsize=max(1, int(payload_nbytes)))
    else:
        raise ValueError(f"collective={collective!r}: allowed 'allreduce', 'allgather'")
    return int(t.nbytes.max())
