"""MobileNet's depthwise-separable convolution (Howard et al. 2017), counted in MACs.

A standard convolution with a D_k x D_k kernel, M input and N output channels on a
D_f x D_f output map costs D_k^2 M N D_f^2 multiply-accumulates. MobileNet splits it into a
depthwise convolution (one D_k x D_k filter per input channel: D_k^2 M D_f^2) and a 1x1
pointwise convolution that mixes the channels (M N D_f^2). The ratio of the costs is

    (D_k^2 M D_f^2 + M N D_f^2) / (D_k^2 M N D_f^2) = 1/N + 1/D_k^2

so a 3 x 3 layer does 8 to 9 times less work.
"""

from __future__ import annotations

from fractions import Fraction

from coursekit import checks

__all__ = ["conv_macs", "separable_macs", "separable_ratio"]


def _check(k, m, n, f):
    return [checks.integer(v, name, at_least=1)
            for v, name in ((k, "kernel"), (m, "in_channels"), (n, "out_channels"), (f, "out_size"))]


def conv_macs(kernel: int, in_channels: int, out_channels: int, out_size: int) -> int:
    """D_k^2 M N D_f^2: every output pixel of every output channel sums D_k^2 M products."""
    k, m, n, f = _check(kernel, in_channels, out_channels, out_size)
    return k * k * m * n * f * f


def separable_macs(kernel: int, in_channels: int, out_channels: int, out_size: int) -> dict:
    """{"depthwise": D_k^2 M D_f^2, "pointwise": M N D_f^2, "total": their sum}."""
    k, m, n, f = _check(kernel, in_channels, out_channels, out_size)
    depthwise, pointwise = k * k * m * f * f, m * n * f * f
    return {"depthwise": depthwise, "pointwise": pointwise, "total": depthwise + pointwise}


def separable_ratio(kernel: int, out_channels: int) -> Fraction:
    """1/N + 1/D_k^2, exactly: the separable layer's cost over the standard one's."""
    k = checks.integer(kernel, "kernel", at_least=1)
    n = checks.integer(out_channels, "out_channels", at_least=1)
    return Fraction(1, n) + Fraction(1, k * k)
