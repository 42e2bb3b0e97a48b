"""MobileNet's cost ratio against MACs counted by looping over a real convolution's products."""

from fractions import Fraction

import numpy as np
import pytest

from coursekit.nn.separable import conv_macs, separable_macs, separable_ratio


def _count(k, m, n, f, depthwise=False):
    """Multiply-accumulates of a convolution, counted one output element at a time."""
    x = np.ones((m, f + k - 1, f + k - 1))
    macs = 0
    for out in range(m if depthwise else n):
        for i in range(f):
            for j in range(f):
                window = x[out:out + 1] if depthwise else x  # one channel, or all M
                macs += window[:, i:i + k, j:j + k].size
    return macs


@pytest.mark.parametrize("k, m, n, f", [(3, 4, 6, 5), (5, 3, 2, 4), (1, 2, 3, 3)])
def test_counts_and_ratio(k, m, n, f):
    assert conv_macs(k, m, n, f) == _count(k, m, n, f)
    sep = separable_macs(k, m, n, f)
    assert sep["depthwise"] == _count(k, m, m, f, depthwise=True)
    assert sep["pointwise"] == _count(1, m, n, f)
    assert Fraction(sep["total"], conv_macs(k, m, n, f)) == separable_ratio(k, n)


def test_bad_input():
    with pytest.raises(ValueError, match="kernel=0"):
        conv_macs(0, 1, 1, 1)
    with pytest.raises(TypeError, match="out_channels"):
        separable_ratio(3, 2.0)
