"""Floating-point formats for mixed precision: fp32, fp16 and bfloat16, and rounding to them.

A binary floating-point format with e exponent bits and m mantissa (fraction) bits stores
x = (-1)^s * 1.f * 2^(E - bias), bias = 2^(e-1) - 1, for the normal numbers, and
x = (-1)^s * 0.f * 2^(1 - bias) for the subnormals (E = 0). So

    largest finite       max       = (2 - 2^-m) * 2^bias
    smallest normal      tiny      = 2^(1 - bias)
    smallest subnormal   subnormal = 2^(1 - bias - m)
    machine epsilon      eps       = 2^-m           (relative rounding error <= eps / 2)
    rounds to inf from   overflow  = (2 - 2^-(m+1)) * 2^bias   (halfway between max and 2^(bias+1))

======  ===  ===  ================  =========  ==========  ===========
format   e    m   max               tiny       subnormal   eps
======  ===  ===  ================  =========  ==========  ===========
fp32     8   23   3.40e38           1.18e-38   1.40e-45    1.19e-7
fp16     5   10   65504             6.10e-5    5.96e-8     9.77e-4
bf16     8    7   3.39e38           1.18e-38   9.18e-41    7.81e-3
======  ===  ===  ================  =========  ==========  ===========

fp16 has more precision but a tiny range: a gradient below 2^-25 becomes 0 (underflow),
one from 65520 up becomes inf (overflow); hence loss scaling. bf16 is the top half of an
fp32 (same sign and exponent bits, the mantissa cut to 7 bits): the range of fp32, the
precision of two and a half decimal digits.

NumPy has float16. bf16 is emulated: :meth:`Format.encode` keeps the high 16 bits of the
fp32 bit pattern after rounding the low 16 away to nearest, ties to even (add
0x7FFF + the lowest kept bit, then truncate), which is what GPUs do; a value past
``overflow`` carries into the exponent and becomes inf, as on the hardware; NaN stays NaN.
Subnormals are kept (no flush to zero). Every value is first made an fp32 (the emulated
GPU computes in fp32, so what it rounds to 16 bits is always an fp32).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["FORMATS", "Format", "get_format", "round_to"]


@dataclass(frozen=True)
class Format:
    """A floating-point format: its bit counts and the NumPy type its values are stored in."""

    name: str
    exponent_bits: int
    mantissa_bits: int
    storage: np.dtype  # float32, float16, or uint16 (bf16's bit pattern)

    @property
    def bits(self) -> int:
        return 1 + self.exponent_bits + self.mantissa_bits

    @property
    def bias(self) -> int:
        return 2 ** (self.exponent_bits - 1) - 1

    @property
    def max(self) -> float:
        return (2 - 2.0**-self.mantissa_bits) * 2.0**self.bias

    @property
    def tiny(self) -> float:
        return 2.0 ** (1 - self.bias)

    @property
    def subnormal(self) -> float:
        return 2.0 ** (1 - self.bias - self.mantissa_bits)

    @property
    def eps(self) -> float:
        return 2.0**-self.mantissa_bits

    @property
    def overflow(self) -> float:
        return (2 - 2.0 ** -(self.mantissa_bits + 1)) * 2.0**self.bias

    def encode(self, x) -> np.ndarray:
        """x rounded to this format, in its storage type (a new array, 16 or 32 bits a value)."""
        with np.errstate(over="ignore"):  # overflow to inf is what the format does
            x32 = np.array(x, dtype=np.float32, ndmin=1)  # past fp32's range: inf already here
            if self.storage != np.uint16:
                return x32.astype(self.storage)
            bits = x32.view(np.uint32)
            kept = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> 16
        return np.where(np.isnan(x32), np.uint16(0x7FC0), kept.astype(np.uint16))

    def decode(self, stored: np.ndarray) -> np.ndarray:
        """The fp32 values of an array in this format's storage type (exact: no rounding)."""
        if self.storage == np.uint16:
            return (np.asarray(stored, np.uint16).astype(np.uint32) << 16).view(np.float32)
        return np.asarray(stored).astype(np.float32)

    def round(self, x) -> np.ndarray:
        """x rounded to this format (round to nearest, ties to even), as fp32 values."""
        return self.decode(self.encode(x))


FORMATS = {
    "fp32": Format("fp32", 8, 23, np.dtype(np.float32)),
    "fp16": Format("fp16", 5, 10, np.dtype(np.float16)),
    "bf16": Format("bf16", 8, 7, np.dtype(np.uint16)),
}


def get_format(fmt) -> Format:
    """The :class:`Format` named ``fmt`` ("fp32", "fp16", "bf16"), or ``fmt`` if it is one."""
    if isinstance(fmt, Format):
        return fmt
    if not isinstance(fmt, str) or fmt not in FORMATS:
        raise ValueError(f"fmt={fmt!r} is not supported; allowed: {', '.join(FORMATS)}")
    return FORMATS[fmt]


def round_to(x, fmt) -> np.ndarray:
    """x (real numbers) rounded to the format ``fmt``, returned as an fp32 array.

    >>> round_to([1 + 2**-8, 1 + 3 * 2**-8], "bf16")   # halfway cases: ties to even
    array([1.      , 1.015625], dtype=float32)
    """
    fmt = get_format(fmt)
    arr = np.asarray(x)
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"x must hold real numbers; got dtype {arr.dtype}")
    return fmt.round(arr).reshape(arr.shape)
