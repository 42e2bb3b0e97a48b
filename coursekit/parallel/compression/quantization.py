"""Quantization: fewer bits per element (the lecture's first way to shrink a message).

n is the number of gradient elements, s its itemsize (4 for float32, 8 for float64).

=============  =====================================================  ========  ===================
compressor     formula                                                unbiased  bytes on the wire
=============  =====================================================  ========  ===================
NoCompression  C(x) = x                                               yes       n s
FP16           C(x) = fp16(x) (round to nearest half precision)       no        2 n
Uniform(b)     C(x)_i = m/L round(L x_i / m), m = max|x|,             no        s + ceil((nb+1)/8)
               L = 2^(b-1) - 1 levels on each side of zero
QSGD(s)        C(x)_i = ||x||_2 sign(x_i) xi_i / s, xi_i in {l, l+1}  yes       s + ceil((nw+1)/8),
               with l = floor(s |x_i| / ||x||_2), P(xi_i = l + 1) =             w = ceil(log2(2s+1))
               s |x_i| / ||x||_2 - l  (Alistarh et al., NeurIPS 2017)
TernGrad       C(x)_i = m sign(x_i) b_i, m = max|x|,                  yes       s + ceil((2n+1)/8)
               b_i ~ Bernoulli(|x_i| / m)  (Wen et al., NeurIPS 2017)
=============  =====================================================  ========  ===================

FP16 allreduces half-precision arrays (the sum is taken in fp16, as NCCL does); the others
send a scale plus bit-packed integer codes and their end mark (:func:`.bitpack.pack_marked`,
the "+ 1" bit above) and are allgathered. The mark lets a rank see that a payload holds
another number of codes than its gradient has elements, which the byte count alone cannot
(10 and 12 TernGrad codes both fill 3 bytes): decompress raises ValueError naming both
counts. It costs a byte only when n w is a multiple of 8. TernGrad is QSGD with one level
and the max norm instead of the Euclidean norm: both are
:class:`LevelQuantizer`, and so is the deterministic Uniform quantizer.
"""

from __future__ import annotations

import numpy as np

from coursekit import checks

from . import bitpack
from .base import Compressor, join, split

FP16_MAX = float(np.finfo(np.float16).max)


class NoCompression(Compressor):
    """C(x) = x: the uncompressed baseline, allreduced. n s bytes; unbiased (exact)."""

    collective = "allreduce"
    unbiased = True
    name = "none"

    def variance_bound(self, n: int) -> float:
        return 0.0

    def _compress(self, x):
        return x.copy()

    def _decompress(self, data, n, dtype):
        return data


class FP16(Compressor):
    """C(x) = fp16(x): half precision, allreduced. 2 n bytes; biased (rounding).

    Values beyond fp16's range (|x| > 65504) raise ValueError instead of becoming inf.
    """

    collective = "allreduce"
    name = "fp16"

    def _compress(self, x):
        peak = float(np.abs(x).max())
        if peak > FP16_MAX:
            raise ValueError(f"fp16 cannot hold gradient values up to {peak:.3g} (max {FP16_MAX}); "
                             "scale the loss down or use another compressor")
        return x.astype(np.float16)

    def _decompress(self, data, n, dtype):
        return data.astype(dtype)


class LevelQuantizer(Compressor):
    """C(x)_i = m sign(x_i) q_i / L with integer q_i in [0, L], m = norm(x).

    ``norm`` is "max" (m = max|x|) or "l2" (m = ||x||_2); ``stochastic`` rounds
    L |x_i| / m up with probability equal to its fractional part (unbiased), otherwise to
    the nearest level (biased). Payload: m (the gradient's dtype) then the codes
    sign(x_i) q_i + L packed in w = ceil(log2(2L + 1)) bits each and the end mark:
    s + ceil((n w + 1) / 8) bytes.
    """

    def __init__(self, levels: int, norm: str, stochastic: bool, rng=None):
        self.levels = checks.integer(levels, "levels", 1, (1 << (bitpack.MAX_WIDTH - 1)) - 1)
        if norm not in ("max", "l2"):
            raise ValueError(f"norm={norm!r}: allowed 'max' or 'l2'")
        self.norm, self.stochastic = norm, bool(stochastic)
        self.unbiased = self.stochastic
        self._rng = checks.rng(rng, "rng") if stochastic else None
        self.width = int(np.ceil(np.log2(2 * self.levels + 1)))

    def variance_bound(self, n: int) -> float | None:
        """Stochastic rounding: omega = min(n / L^2, sqrt(n) / L) (Alistarh et al. 2017,
        Lemma 3.1; it holds for m = max|x| too, as max|x| <= ||x||_2). QSGD with s = 4
        levels on the 4,810 parameters of chapter 6's MLP: omega = 17."""
        if not self.stochastic:
            return None
        return min(n / self.levels**2, np.sqrt(n) / self.levels)

    def _compress(self, x):
        m = np.abs(x).max() if self.norm == "max" else np.linalg.norm(x)
        m = x.dtype.type(m)
        if m > 0:
            scaled = np.minimum(np.abs(x) * (self.levels / m), self.levels)
        else:
            scaled = np.zeros_like(x)
        if self.stochastic:
            q = np.floor(scaled)
            q += self._rng.random(x.size) < (scaled - q)
        else:
            q = np.rint(scaled)
        codes = (np.where(x < 0, -q, q) + self.levels).astype(np.uint32)
        return join(np.array([m], x.dtype), bitpack.pack_marked(codes, self.width))

    def _decompress(self, data, n, dtype):
        m, packed = split(data, (dtype, 1), (np.uint8, -1))
        codes = bitpack.unpack_marked(packed, n, self.width).astype(np.int64) - self.levels
        return codes * (m[0] / self.levels)


class Uniform(LevelQuantizer):
    """b-bit uniform quantization, nearest rounding: C(x)_i = m/L round(L x_i / m),
    m = max|x|, L = 2^(b-1) - 1. s + ceil((n b + 1) / 8) bytes; biased (|error| <= m / 2L).
    ``bits`` in [2, 16] (b = 8 is the common INT8 gradient quantization)."""

    name = "uniform"

    def __init__(self, bits: int = 8):
        self.bits = checks.integer(bits, "bits", 2, bitpack.MAX_WIDTH)
        super().__init__((1 << (self.bits - 1)) - 1, "max", stochastic=False)


class QSGD(LevelQuantizer):
    """QSGD with s levels: stochastic rounding of s |x_i| / ||x||_2. Unbiased;
    s + ceil((n ceil(log2(2s+1)) + 1) / 8) bytes. ``levels`` s in [1, 32767]; ``rng`` a
    np.random.Generator (or int seed), one per rank."""

    name = "qsgd"

    def __init__(self, levels: int = 4, *, rng):
        super().__init__(levels, "l2", stochastic=True, rng=rng)


class TernGrad(LevelQuantizer):
    """TernGrad: C(x)_i = max|x| sign(x_i) b_i, b_i ~ Bernoulli(|x_i| / max|x|).
    Unbiased; s + ceil((2n + 1) / 8) bytes (a 2-bit code per element, the end mark)."""

    name = "terngrad"

    def __init__(self, *, rng):
        super().__init__(1, "max", stochastic=True, rng=rng)
