"""Pruning's size cut: CSR bytes by hand, the most weights a budget keeps, magnitude pruning."""

import numpy as np
import pytest

from coursekit.memory.pruning import keep_to_fit, magnitude_prune, sparse_bytes
from coursekit.nn import MLP


def test_sparse_bytes_count_values_indices_pointers_and_biases():
    sizes = [3, 4, 2]  # W0 3x4, W1 4x2: 20 weights, biases 4 + 2, row pointers 4 + 5
    assert sparse_bytes(sizes, 5) == 5 * 8 + 5 * 4 + (4 + 2) * 8 + (4 + 5) * 4
    assert sparse_bytes(sizes, 5, itemsize=4, index_bytes=2) == 5 * 4 + 5 * 2 + 6 * 4 + 9 * 2


def test_keep_to_fit_is_the_largest_count_under_the_budget():
    sizes = [64] + [512] * 7 + [10]
    k = keep_to_fit(sizes, 8_000_000)
    assert sparse_bytes(sizes, k) <= 8_000_000 < sparse_bytes(sizes, k + 1)
    assert keep_to_fit([3, 4, 2], 10**9) == 20  # never more weights than the model has
    with pytest.raises(ValueError, match="the biases and row pointers alone take"):
        keep_to_fit([3, 4, 2], 10)


def test_magnitude_pruning_keeps_the_largest_weights_and_the_biases():
    mlp = MLP([5, 6, 3], seed=1, dtype=np.float64)
    pruned = magnitude_prune(mlp, 10)
    weights = np.concatenate([abs(layer.W).ravel() for layer in mlp.layers])
    kept = np.concatenate([layer.W.ravel() for layer in pruned.layers])
    assert np.count_nonzero(kept) == 10
    assert abs(kept[kept != 0]).min() >= np.sort(weights)[-10]
    for a, b in zip(mlp.layers, pruned.layers):
        assert np.array_equal(a.b, b.b)
        assert np.array_equal(b.W[b.W != 0], a.W[b.W != 0])
    assert np.count_nonzero(np.concatenate([l.W.ravel() for l in mlp.layers])) == 48  # untouched
    with pytest.raises(ValueError, match=r"kept=49"):
        magnitude_prune(mlp, 49)
