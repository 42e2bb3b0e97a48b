"""Data sets, sharding and mini-batches (chapter 1, used by every later chapter)."""

import numpy as np
import pytest
from sklearn.datasets import load_digits as sk_digits

from coursekit.data import load_digits, make_classification, make_regression, minibatches, shard, validation_split


def test_digits_split_is_fixed_stratified_and_standardized():
    d = load_digits()
    X_raw, y_raw = sk_digits(return_X_y=True)
    assert len(d.X_train) + len(d.X_test) == len(X_raw) == 1797
    assert d.X_train.dtype == np.float32 and d.n_classes == 10 and d.n_features == 64
    # every class keeps its share of the test set (stratified)
    for c in range(10):
        assert abs(np.mean(d.y_test == c) - np.mean(y_raw == c)) < 0.01
    # train columns are standardized with the training statistics (constant pixels stay 0)
    std = d.X_train.std(axis=0)
    np.testing.assert_allclose(d.X_train.mean(axis=0), 0, atol=1e-5)
    assert np.all((np.abs(std - 1) < 1e-4) | (std == 0))
    # same seed, same split; the split is a partition of the original images
    again = load_digits()
    np.testing.assert_array_equal(again.X_test, d.X_test)
    assert not np.array_equal(load_digits(seed=1).y_test, d.y_test)
    # every image lands in exactly one side: the labels of both sides are the original labels
    all_y = np.sort(np.concatenate([d.y_train, d.y_test]))
    np.testing.assert_array_equal(all_y, np.sort(y_raw))


def test_make_classification_is_seeded_and_learnable_by_class_means():
    a = make_classification(n_samples=400, n_features=20, n_classes=4, seed=1)
    b = make_classification(n_samples=400, n_features=20, n_classes=4, seed=1)
    np.testing.assert_array_equal(a.X_train, b.X_train)
    assert a.X_train.shape == (320, 20) and set(np.unique(a.y_train)) == {0, 1, 2, 3}
    # nearest class mean (estimated on train) classifies the test set well: classes are separated
    means = np.stack([a.X_train[a.y_train == c].mean(axis=0) for c in range(4)])
    pred = np.argmin(((a.X_test[:, None, :] - means) ** 2).sum(axis=2), axis=1)
    assert np.mean(pred == a.y_test) > 0.8


def test_make_regression_is_linear_plus_noise():
    d = make_regression(n_samples=2000, n_features=5, n_outputs=2, noise=0.1, seed=0)
    assert d.y_train.shape == (1600, 2) and d.n_classes == 0
    X1 = np.hstack([d.X_train, np.ones((len(d.X_train), 1))])
    coef, *_ = np.linalg.lstsq(X1, d.y_train, rcond=None)
    resid = d.y_train - X1 @ coef
    assert resid.std() < 0.2 * d.y_train.std()


@pytest.mark.parametrize("n, size", [(10, 3), (9, 3), (5, 5), (7, 1)])
def test_shards_partition_the_rows_in_rank_order(n, size):
    X, y = np.arange(2 * n).reshape(n, 2), np.arange(n)
    parts = [shard(X, y, r, size) for r in range(size)]
    np.testing.assert_array_equal(np.concatenate([p[0] for p in parts]), X)
    np.testing.assert_array_equal(np.concatenate([p[1] for p in parts]), y)
    lengths = [len(p[1]) for p in parts]
    assert max(lengths) - min(lengths) <= 1 and lengths == sorted(lengths, reverse=True)


@pytest.mark.parametrize(
    "args, error, match",
    [
        ((0, 0), ValueError, "size=0: must be >= 1"),
        ((3, 3), ValueError, r"rank=3: must be in \[0, size\) = \[0, 3\)"),
        ((0, 11), ValueError, "size=11 exceeds the number of rows"),
        ((0.5, 2), TypeError, "rank must be an integer"),
    ],
)
def test_shard_rejects_bad_ranks(args, error, match):
    with pytest.raises(error, match=match):
        shard(np.zeros((10, 2)), np.zeros(10), *args)


def test_minibatches_cover_every_row_once_and_reshuffle():
    X, y = np.arange(20).reshape(10, 2), np.arange(10)
    rng = np.random.default_rng(0)
    epoch1 = list(minibatches(X, y, 4, rng))
    epoch2 = list(minibatches(X, y, 4, rng))
    assert [len(b[1]) for b in epoch1] == [4, 4, 2]
    for epoch in (epoch1, epoch2):
        ys = np.concatenate([b[1] for b in epoch])
        np.testing.assert_array_equal(np.sort(ys), y)
        for Xb, yb in epoch:
            np.testing.assert_array_equal(Xb[:, 0] // 2, yb)  # rows stay paired
            assert Xb.flags.c_contiguous
    assert not np.array_equal(np.concatenate([b[1] for b in epoch1]), np.concatenate([b[1] for b in epoch2]))
    np.testing.assert_array_equal(np.concatenate([b[1] for b in minibatches(X, y, 3)]), y)
    with pytest.raises(ValueError, match="batch_size=0"):
        next(minibatches(X, y, 0))


def test_validation_split_partitions_the_rows_stratified_and_seeded():
    X = np.arange(200, dtype=float).reshape(100, 2)
    y = np.repeat(np.arange(4), 25)
    X_fit, y_fit, X_val, y_val = validation_split(X, y, 0.2, seed=1)
    assert len(X_val) == 20 and len(X_fit) == 80
    assert sorted(np.concatenate([X_fit[:, 0], X_val[:, 0]])) == sorted(X[:, 0])  # a partition
    assert np.array_equal((X_val[:, 0] // 2) // 25, y_val) and np.array_equal((X_fit[:, 0] // 2) // 25, y_fit)
    assert np.bincount(y_val).tolist() == [5, 5, 5, 5]  # round(0.2 * 25) of each class
    assert np.array_equal(X[(X_val[:, 0] // 2).astype(int), 1], X_val[:, 1])  # rows stay whole
    again = validation_split(X, y, 0.2, seed=1)
    assert all(np.array_equal(a, b) for a, b in zip(again, (X_fit, y_fit, X_val, y_val)))
    targets = validation_split(X, np.linspace(0, 1, 100), 0.3, seed=0)  # float targets: a random 30
    assert len(targets[2]) == 30


@pytest.mark.parametrize("args, error, match", [
    ((np.zeros((10, 2)), np.zeros(10, int), 0.0), ValueError, "fraction"),
    ((np.zeros((10, 2)), np.zeros(10, int), 1.0), ValueError, "fraction"),
    ((np.zeros((10, 2)), np.zeros(10, int), 0.01), ValueError, "empty validation part"),
    ((np.zeros((1, 2)), np.zeros(1, int), 0.9), ValueError, "empty training part"),
    ((np.zeros((10, 2)), np.zeros(9, int), 0.2), ValueError, "same number of rows"),
    ((np.zeros((10, 2)), np.zeros(10, int), "a"), TypeError, "fraction"),
])
def test_validation_split_rejects_bad_input(args, error, match):
    with pytest.raises(error, match=match):
        validation_split(*args)
