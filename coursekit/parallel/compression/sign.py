"""1-bit compression: send only the sign of every element.

* signSGD with majority vote (Bernstein et al., ICML 2018, their Algorithm 3; ICLR 2019),
  ``Sign(scaled=False)``: C(x)_i = sign(x_i) (+1 for 0: one bit cannot say zero).
  ceil((n + 1) / 8) bytes: the bits and an end mark. Biased, and it forgets the magnitude.
  The ranks step with the **majority vote** v = sign(sum_k sign(x_k)) (:meth:`Sign.aggregate`;
  a tie, possible with an even number of ranks, counts as +1 like a zero), so every
  element moves by exactly lr, whatever the gradient's size. The vote is one bit per
  element again: in the paper's parameter-server form each worker sends its n signs up and
  gets the n-bit vote back (a 1-bit downlink, about n/8 bytes each way). Here there is no
  server: the payloads are allgathered (a ring: each rank sends (p - 1) payloads of
  ceil((n + 1) / 8) bytes) and every rank counts the same vote itself. Averaging the signs
  instead, (1/p) sum_k sign(x_k), would be another algorithm: a step of lr times the
  fraction of workers that agree, not a 1-bit result.
* scaled sign (1-bit SGD, Seide et al. 2014; EF-signSGD, Karimireddy et al., ICML 2019),
  ``Sign()``: C(x)_i = (||x||_1 / n) sign(x_i). s + ceil((n + 1) / 8) bytes (the scale in
  the gradient's dtype, then the bits and the end mark). Biased. With error feedback
  (:mod:`.memory`) it is EF-signSGD, which converges like SGD where plain signSGD may not.
  The ranks average the decompressed payloads (the default :meth:`.Compressor.aggregate`).

The end mark (:func:`.bitpack.pack_marked`: one 1 bit after the signs) lets a rank see
that a payload holds another number of signs than its gradient has, which the byte count
alone cannot (10 and 12 signs both fill 2 bytes): decompress raises ValueError. It costs a
byte only when n is a multiple of 8 (the 4810 signs of chapter 6's MLP fit 602 bytes
either way).
"""

from __future__ import annotations

import numpy as np

from coursekit import checks

from . import bitpack
from .base import Compressor, join, split


class Sign(Compressor):
    """C(x) = scale * sign(x), scale = ||x||_1 / n (``scaled``) or 1; unscaled, the ranks
    step with the majority vote of their signs (signSGD, :meth:`aggregate`)."""

    def __init__(self, scaled: bool = True):
        self.scaled = checks.boolean(scaled, "scaled")
        self.name = "sign" if self.scaled else "signsgd"

    def _compress(self, x):
        bits = bitpack.pack_marked(x >= 0, 1)
        if not self.scaled:
            return bits
        return join(np.array([np.abs(x).mean()], x.dtype), bits)

    def _decompress(self, data, n, dtype):
        if self.scaled:
            scale, data = split(data, (dtype, 1), (np.uint8, -1))
        else:
            scale = np.ones(1, dtype)
        return np.where(bitpack.unpack_marked(data, n, 1) == 1, scale[0], -scale[0])

    def aggregate(self, parts: list) -> np.ndarray:
        """signSGD: the majority vote sign(sum of the ranks' signs), +1 on a tie (a vector
        of +-1: one bit per element); the scaled sign: the mean."""
        if self.scaled:
            return super().aggregate(parts)
        votes = np.sum(parts, axis=0)  # integers in floating point: exact in any order
        return np.where(votes >= 0, 1, -1).astype(parts[0].dtype)
