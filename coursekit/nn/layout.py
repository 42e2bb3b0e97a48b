"""Where each layer's parameters live in the one flat parameter buffer.

An MLP with ``sizes = [n_0, n_1, ..., n_L]`` has, for layer l = 1..L, a weight matrix
W of shape (n_{l-1}, n_l) and a bias b of shape (n_l,). A batch is a matrix with one
sample per row, so a layer computes Z = A_prev W + b: our W is the transpose of the
lecture's W^l (which acts on one column vector: z^l = W^l a^{l-1} + b^l). Row-major
W (n_in, n_out) makes the forward product a plain A_prev @ W, the fastest BLAS case for
the small matrices of this course (measured: about 2x faster than A_prev @ W^T at 32 x 64 x 128).
The layers are stored one after the other::

    [ W_1 (row-major) | b_1 | W_2 | b_2 | ... | W_L | b_L ]

so a layer is one contiguous range (a pipeline stage or a parameter-server shard is a
range too) and the whole gradient is one buffer (one allreduce, buckets are slices).
"""

from __future__ import annotations

import numbers
from dataclasses import dataclass

import numpy as np

from coursekit import checks

__all__ = ["LayerSlice", "check_fits", "check_sizes", "layer_slices", "n_params", "views"]


@dataclass(frozen=True)
class LayerSlice:
    """Position of layer ``index`` (0-based) in the flat buffer."""

    index: int
    n_in: int
    n_out: int
    start: int  # first element of W

    @property
    def w_stop(self) -> int:
        return self.start + self.n_out * self.n_in

    @property
    def stop(self) -> int:  # one past the last bias element
        return self.w_stop + self.n_out

    @property
    def slice(self) -> slice:
        """The whole layer (W then b)."""
        return slice(self.start, self.stop)


def check_sizes(sizes) -> tuple[int, ...]:
    """Validate layer sizes: at least two positive integers (input and output width)."""
    try:
        items = list(sizes)
    except TypeError:
        raise TypeError(f"sizes must be a sequence of layer widths, got {sizes!r}") from None
    if len(items) < 2:
        raise ValueError(
            f"sizes={items!r}: need at least an input and an output width, e.g. [64, 32, 10]"
        )
    for i, s in enumerate(items):
        if isinstance(s, bool) or not isinstance(s, numbers.Integral):
            raise TypeError(f"sizes[{i}]={s!r}: layer widths must be integers")
        if s < 1:
            raise ValueError(f"sizes[{i}]={s}: every layer width must be a positive integer (>= 1)")
    return tuple(int(s) for s in items)


def check_fits(sizes, itemsize: int, name: str = "sizes") -> int:
    """The number of parameters of an MLP of ``sizes`` if its flat buffer (``itemsize``
    bytes each) fits in this machine's memory: ValueError naming ``name`` and the bytes
    otherwise (:func:`coursekit.checks.fits_in_memory`), never a MemoryError later."""
    sizes = check_sizes(sizes)
    n = sum(n_in * n_out + n_out for n_in, n_out in zip(sizes[:-1], sizes[1:]))
    checks.fits_in_memory(n * itemsize, f"{name}={sizes!r:.60}",
                          f"the {n:,} parameters ({itemsize} bytes each)")
    return n


def layer_slices(sizes) -> list[LayerSlice]:
    """The LayerSlice of every layer, in order."""
    sizes = check_sizes(sizes)
    out, start = [], 0
    for i, (n_in, n_out) in enumerate(zip(sizes[:-1], sizes[1:])):
        out.append(LayerSlice(i, n_in, n_out, start))
        start = out[-1].stop
    return out


def n_params(sizes) -> int:
    """Total parameters: sum over layers of n_out * n_in + n_out."""
    return layer_slices(sizes)[-1].stop


def views(flat: np.ndarray, sizes) -> list[tuple[np.ndarray, np.ndarray]]:
    """(W, b) views into ``flat`` for every layer; writing to a view writes the buffer."""
    slices = layer_slices(sizes)
    if flat.ndim != 1 or flat.size != slices[-1].stop:
        raise ValueError(
            f"flat buffer has shape {flat.shape}; sizes {list(sizes)} need ({slices[-1].stop},)"
        )
    return [
        (flat[s.start : s.w_stop].reshape(s.n_in, s.n_out), flat[s.w_stop : s.stop])
        for s in slices
    ]
