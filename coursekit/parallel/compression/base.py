"""What every compressor shares: the payload, the input checks, the byte layout helpers.

GRACE's split (Xu et al., "GRACE: A Compressed Communication Framework for Distributed
Machine Learning", ICDCS 2021): a **compressor** turns a gradient into a payload and back
(``compress`` / ``decompress``), a **memory** (:mod:`.memory`) keeps what compression lost,
a **communicator** (:mod:`.communicator`) moves payloads between ranks.

A payload is ONE NumPy array (:class:`Compressed` ``.data``): exactly the bytes that cross
the wire, so ``payload.nbytes`` is what the trace counts. Its ``shape`` and ``dtype``
(the gradient's) are the context every rank knows already; they are not sent.

* ``collective = "allreduce"``: payloads are float arrays that can be summed elementwise
  (the compression is linear: none, fp16), so ranks allreduce them and decompress the sum.
* ``collective = "allgather"``: payloads are ``uint8`` byte strings (scales, packed codes,
  indices + values) that cannot be summed; every rank gathers all of them and decompresses
  each one.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coursekit import checks

FLOATS = (np.dtype(np.float32), np.dtype(np.float64))
INDEX = np.dtype(np.int32)  # sparse payloads send int32 indices: 4 bytes each


class Diverged(ValueError):
    """Training diverged: a gradient (or the loss) is NaN or infinite."""


@dataclass(frozen=True)
class Compressed:
    """A payload (``data``, the bytes on the wire) and its context (not sent)."""

    data: np.ndarray
    shape: tuple
    dtype: np.dtype

    @property
    def nbytes(self) -> int:
        """Bytes this rank puts on the wire for one copy of the payload."""
        return int(self.data.nbytes)

    @property
    def size(self) -> int:
        """Number of gradient elements it stands for."""
        return int(np.prod(self.shape, dtype=np.int64))


class Compressor:
    """Base class: subclasses set ``collective``, ``unbiased`` and implement
    ``_compress(flat) -> data`` and ``_decompress(data, n, dtype) -> flat``."""

    collective = "allgather"
    unbiased = False
    name = "compressor"

    def compress(self, x) -> Compressed:
        """The payload for gradient ``x`` (float32 or float64, any shape, finite)."""
        x = check_gradient(x)
        return Compressed(self._compress(x.ravel()), x.shape, x.dtype)

    def decompress(self, payload: Compressed) -> np.ndarray:
        """The gradient the payload stands for: same shape and dtype as the input."""
        if not isinstance(payload, Compressed):
            raise TypeError(f"decompress needs a Compressed payload, got {type(payload).__name__}")
        flat = self._decompress(payload.data, payload.size, payload.dtype)
        return flat.astype(payload.dtype, copy=False).reshape(payload.shape)

    def aggregate(self, parts: list) -> np.ndarray:
        """What every rank steps with, from the decompressed payloads of all ranks (rank
        order), for the "allgather" collective; GRACE's ``aggregate``. Default: their mean,
        summed in rank order (bit-identical on every rank). signSGD overrides it with the
        majority vote (:mod:`.sign`)."""
        total = np.zeros_like(parts[0])
        for part in parts:
            total += part
        total /= len(parts)
        return total

    def variance_bound(self, n: int) -> float | None:
        """omega with E||C(x) - x||^2 <= omega ||x||^2 for every x of n elements, if the
        compressor is unbiased (None: biased, or no bound known). Error feedback adds
        x - C(x) back, so with omega > 1 its residual can grow every step (Stich and
        Karimireddy 2020 use C / (omega + 1) there instead)."""
        return None

    def _compress(self, x: np.ndarray) -> np.ndarray:
        raise NotImplementedError

    def _decompress(self, data: np.ndarray, n: int, dtype: np.dtype) -> np.ndarray:
        raise NotImplementedError

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in vars(self).items() if not k.startswith("_"))
        return f"{type(self).__name__}({args})"


def check_gradient(x) -> np.ndarray:
    """``x`` as an ndarray of float32/float64 with finite values; TypeError/ValueError otherwise."""
    if not isinstance(x, np.ndarray):
        raise TypeError(f"a gradient must be a NumPy array, got {type(x).__name__}")
    if x.dtype not in FLOATS:
        raise TypeError(f"gradients must be float32 or float64 arrays; got dtype {x.dtype}")
    if x.size == 0:
        raise ValueError("the gradient is empty: nothing to compress")
    if not np.isfinite(x).all():
        raise Diverged("the gradient contains NaN or infinite values (did training diverge?)")
    return x


def check_ratio(ratio) -> float:
    """A fraction of elements to keep, in (0, 1]."""
    return checks.real(ratio, "ratio", above=0, at_most=1,
                       hint=" (the fraction of elements kept: 99% sparsity is ratio=0.01)")


def join(*arrays: np.ndarray) -> np.ndarray:
    """Concatenate the raw bytes of ``arrays`` into one uint8 payload."""
    return np.concatenate([np.ascontiguousarray(a).reshape(-1).view(np.uint8) for a in arrays])


def split(data: np.ndarray, *layout: tuple) -> list[np.ndarray]:
    """Inverse of :func:`join`: ``layout`` is (dtype, count) per array; count -1 takes the rest."""
    out, pos = [], 0
    for dtype, count in layout:
        dtype = np.dtype(dtype)
        stop = data.size if count == -1 else pos + count * dtype.itemsize
        out.append(data[pos:stop].view(dtype))
        pos = stop
    if pos != data.size:
        raise ValueError(f"payload has {data.size} bytes but its layout describes {pos}")
    return out
