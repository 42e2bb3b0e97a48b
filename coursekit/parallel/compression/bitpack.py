"""Pack unsigned integer codes of ``width`` bits into bytes (so 1-bit signs cost n/8 bytes).

``pack(codes, width)`` writes code i's bit j (least significant first) at bit i*width + j of
the output; ``unpack(data, n, width)`` reads them back. ceil(n * width / 8) bytes.
"""

from __future__ import annotations

import numpy as np

MAX_WIDTH = 16


def packed_nbytes(n: int, width: int) -> int:
    """ceil(n * width / 8)."""
    return -(-n * width // 8)


def pack(codes: np.ndarray, width: int) -> np.ndarray:
    """uint8 array holding the low ``width`` bits of every code in ``codes``."""
    if not 1 <= width <= MAX_WIDTH:
        raise ValueError(f"width={width}: codes of 1..{MAX_WIDTH} bits are supported")
    codes = np.asarray(codes, dtype=np.uint32).ravel()
    if codes.size and int(codes.max()) >> width:
        raise ValueError(f"a code does not fit in {width} bits (max {int(codes.max())})")
    bits = ((codes[:, None] >> np.arange(width, dtype=np.uint32)) & 1).astype(np.uint8)
    return np.packbits(bits.ravel(), bitorder="little")


def unpack(data: np.ndarray, n: int, width: int) -> np.ndarray:
    """The ``n`` codes (uint32) that :func:`pack` stored in ``data``."""
    if data.size != packed_nbytes(n, width):
        raise ValueError(f"{n} codes of {width} bits need {packed_nbytes(n, width)} bytes, "
                         f"got {data.size}")
    bits = np.unpackbits(data, count=n * width, bitorder="little").reshape(n, width)
    return (bits.astype(np.uint32) << np.arange(width, dtype=np.uint32)).sum(axis=1,
                                                                            dtype=np.uint32)
