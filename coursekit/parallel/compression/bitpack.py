"""Pack unsigned integer codes of ``width`` bits into bytes (so 1-bit signs cost n/8 bytes).

``pack_marked(codes, width)`` writes code i's bit j (least significant first) at bit
i*width + j of the output, then an **end mark**: a single 1 bit right after the last code,
zeros after it. ceil((n * width + 1) / 8) bytes: one byte more than the codes alone only
when n * width is a multiple of 8. The byte count alone cannot always tell how many codes
a payload holds (10 and 12 one-bit codes both fill 2 bytes), so without the mark a
receiver expecting n codes could not see that the sender packed another number;
``unpack_marked(data, n, width)`` reads the codes back, checks that the mark is at bit
n * width and raises ValueError naming the count the payload holds otherwise. Every
bit-packing compressor (sign, signSGD, Uniform, QSGD, TernGrad) uses it.
"""

from __future__ import annotations

import numpy as np

MAX_WIDTH = 16


def marked_nbytes(n: int, width: int) -> int:
    """ceil((n * width + 1) / 8): the codes and their end mark (:func:`pack_marked`)."""
    return -(-(n * width + 1) // 8)


def _bits(codes: np.ndarray, width: int) -> np.ndarray:
    """The low ``width`` bits of every code, least significant first, as one uint8 0/1 array."""
    if not 1 <= width <= MAX_WIDTH:
        raise ValueError(f"width={width}: codes of 1..{MAX_WIDTH} bits are supported")
    codes = np.asarray(codes, dtype=np.uint32).ravel()
    if codes.size and int(codes.max()) >> width:
        raise ValueError(f"a code does not fit in {width} bits (max {int(codes.max())})")
    return ((codes[:, None] >> np.arange(width, dtype=np.uint32)) & 1).astype(np.uint8).ravel()


def _codes(bits: np.ndarray, n: int, width: int) -> np.ndarray:
    """The ``n`` codes (uint32) whose bits are the first ``n * width`` of ``bits``."""
    bits = bits[:n * width].reshape(n, width)
    return (bits.astype(np.uint32) << np.arange(width, dtype=np.uint32)).sum(axis=1,
                                                                            dtype=np.uint32)


def pack_marked(codes: np.ndarray, width: int) -> np.ndarray:
    """uint8 array holding the low ``width`` bits of every code in ``codes``, then the end
    mark: one 1 bit, then zeros."""
    return np.packbits(np.append(_bits(codes, width), np.uint8(1)), bitorder="little")


def unpack_marked(data: np.ndarray, n: int, width: int) -> np.ndarray:
    """The ``n`` codes that :func:`pack_marked` stored in ``data``; ValueError when ``data``
    holds another number of codes (its size or its end mark says so)."""
    want = marked_nbytes(n, width)
    bits = np.unpackbits(data, bitorder="little")
    ones = np.flatnonzero(bits)
    end = int(ones[-1]) if ones.size else -1  # the mark: the last 1 bit
    if data.size != want or end != n * width:
        held = (f"{end // width} codes" if end >= 0 and end % width == 0
                else "no whole number of codes")
        raise ValueError(f"expected {n} codes of {width} bit(s) ({want} bytes with the end "
                         f"mark at bit {n * width}), got {data.size} bytes holding {held}")
    return _codes(bits, n, width)
