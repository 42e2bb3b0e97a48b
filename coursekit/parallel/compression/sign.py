"""1-bit compression: send only the sign of every element.

* signSGD (Bernstein et al., ICML 2018), ``Sign(scaled=False)``: C(x)_i = sign(x_i) (+1 for
  0: one bit cannot say zero). ceil((n + 1) / 8) bytes: the bits and an end mark. Biased,
  and it forgets the magnitude: the step is lr * (mean of the workers' signs), whatever
  the gradient's size.
* scaled sign (1-bit SGD, Seide et al. 2014; EF-signSGD, Karimireddy et al., ICML 2019),
  ``Sign()``: C(x)_i = (||x||_1 / n) sign(x_i). s + ceil((n + 1) / 8) bytes (the scale in
  the gradient's dtype, then the bits and the end mark). Biased. With error feedback
  (:mod:`.memory`) it is EF-signSGD, which converges like SGD where plain signSGD may not.

The end mark (:func:`.bitpack.pack_marked`: one 1 bit after the signs) lets a rank see
that a payload holds another number of signs than its gradient has, which the byte count
alone cannot (10 and 12 signs both fill 2 bytes): decompress raises ValueError. It costs a
byte only when n is a multiple of 8 (the 4810 signs of chapter 6's MLP fit 602 bytes
either way).

Payloads are allgathered; averaging the workers' signs is the majority vote of signSGD
before its final sign.
"""

from __future__ import annotations

import numpy as np

from . import bitpack
from .base import Compressor, join, split


class Sign(Compressor):
    """C(x) = scale * sign(x), scale = ||x||_1 / n (``scaled``) or 1."""

    def __init__(self, scaled: bool = True):
        self.scaled = bool(scaled)
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
