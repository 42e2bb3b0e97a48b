"""Data sets for the course and the one way to split them across workers.

* :func:`load_digits` - scikit-learn's 8x8 handwritten digits (1797 real images shipped
  with scikit-learn, no download), a fixed stratified train/test split, standardized
  with the training set's mean and standard deviation.
* :func:`make_classification`, :func:`make_regression` - synthetic data of any size,
  for speed experiments and for tests.
* :func:`validation_split` - a validation set held out of the training rows (model selection).
* :func:`shard` - the rows one rank of ``size`` owns (data parallelism).
* :func:`minibatches` - shuffled mini-batches, a fresh order every epoch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coursekit import checks

__all__ = [
    "Dataset", "load_digits", "make_classification", "make_regression", "minibatches", "shard", "validation_split",
]


@dataclass(frozen=True)
class Dataset:
    """A train/test split. ``y`` holds integer labels (classification) or float targets."""

    name: str
    X_train: np.ndarray
    y_train: np.ndarray
    X_test: np.ndarray
    y_test: np.ndarray
    n_classes: int  # 0 for regression

    @property
    def n_features(self) -> int:
        return self.X_train.shape[1]

    def __repr__(self) -> str:
        return (
            f"Dataset({self.name!r}: {len(self.X_train)} train / {len(self.X_test)} test, "
            f"{self.n_features} features, {self.n_classes} classes, {self.X_train.dtype})"
        )


def _split_standardize(name, X, y, n_classes, test_fraction, rng, dtype) -> Dataset:
    """Stratified (per class) or plain random split, then z-score with training statistics."""
    checks.real(test_fraction, "test_fraction", above=0, below=1)
    n = len(X)
    if n_classes:
        test = np.concatenate(
            [
                idx[: int(round(test_fraction * len(idx)))]
                for idx in (rng.permutation(np.flatnonzero(y == c)) for c in range(n_classes))
            ]
        )
    else:
        test = rng.permutation(n)[: int(round(test_fraction * n))]
    is_test = np.zeros(n, dtype=bool)
    is_test[test] = True
    train = rng.permutation(np.flatnonzero(~is_test))
    test = rng.permutation(test)
    mean = X[train].mean(axis=0)
    std = X[train].std(axis=0)
    std[std == 0] = 1  # constant pixels (the digits' borders) stay zero
    Xs = ((X - mean) / std).astype(dtype)
    ys = y if n_classes else y.astype(dtype)
    return Dataset(name, Xs[train], ys[train], Xs[test], ys[test], n_classes)


def load_digits(test_fraction: float = 0.25, seed: int = 0, dtype=np.float32) -> Dataset:
    """scikit-learn's digits (1797 8x8 images, 10 classes): fixed stratified split, standardized.

    The same ``seed`` always gives the same split (450 test images at the default 0.25).
    """
    rng = checks.rng(seed)  # every argument is checked before the slow import
    checks.real(test_fraction, "test_fraction", above=0, below=1)
    dtype = checks.float_dtype(dtype)
    from sklearn.datasets import load_digits as _sk_digits

    X, y = _sk_digits(return_X_y=True)
    return _split_standardize("digits", X.astype(np.float64), y.astype(np.int64), 10, test_fraction, rng, dtype)


def _check_size(n_samples: int, n_columns: int, dtype) -> None:
    """The dtype, and whether the data set fits in memory: it is drawn in float64 and
    standardized into a copy, so at least ``n_samples x n_columns x 8`` bytes twice."""
    checks.float_dtype(dtype)
    checks.fits_in_memory(2 * 8 * n_samples * n_columns, "n_samples and n_features",
                          f"a data set of {n_samples:,} x {n_columns:,} numbers (drawn in "
                          f"float64, then standardized into a copy)")


def make_classification(
    n_samples: int = 2048,
    n_features: int = 784,
    n_classes: int = 10,
    *,
    separation: float = 3.0,
    test_fraction: float = 0.2,
    seed: int = 0,
    dtype=np.float32,
) -> Dataset:
    """Gaussian blobs: x = mu_y + N(0, I), class means mu_c ~ N(0, (separation^2 / n_features) I).

    Any two class means are about ``separation * sqrt(2)`` apart whatever ``n_features``
    is, against unit noise: ``separation`` sets how easy the problem is.
    """
    n_samples = checks.integer(n_samples, "n_samples", at_least=2)
    n_features = checks.integer(n_features, "n_features", at_least=1)
    n_classes = checks.integer(n_classes, "n_classes", at_least=2)
    _check_size(n_samples, n_features, dtype)
    rng = checks.rng(seed)
    means = rng.standard_normal((n_classes, n_features)) * (separation / np.sqrt(n_features))
    y = rng.integers(0, n_classes, n_samples)
    X = means[y] + rng.standard_normal((n_samples, n_features))
    return _split_standardize("classification", X, y, n_classes, test_fraction, rng, dtype)


def make_regression(
    n_samples: int = 1024,
    n_features: int = 16,
    n_outputs: int = 1,
    *,
    noise: float = 0.1,
    test_fraction: float = 0.2,
    seed: int = 0,
    dtype=np.float32,
) -> Dataset:
    """A linear teacher: y = x A + noise * N(0, I), with x ~ N(0, I) and A ~ N(0, 1/n_features).

    ``y`` has shape (n, n_outputs); the "mse" loss fits it.
    """
    n_samples = checks.integer(n_samples, "n_samples", at_least=2)
    n_features = checks.integer(n_features, "n_features", at_least=1)
    n_outputs = checks.integer(n_outputs, "n_outputs", at_least=1)
    _check_size(n_samples, n_features + n_outputs, dtype)
    rng = checks.rng(seed)
    A = rng.standard_normal((n_features, n_outputs)) / np.sqrt(n_features)
    X = rng.standard_normal((n_samples, n_features))
    y = X @ A + noise * rng.standard_normal((n_samples, n_outputs))
    return _split_standardize("regression", X, y, 0, test_fraction, rng, dtype)


def _check_rows(X, y) -> None:
    for name, arr in (("X", X), ("y", y)):
        if not hasattr(arr, "__len__") or not hasattr(arr, "__getitem__"):
            raise TypeError(f"{name} must be an array with one row per sample; got {arr!r:.60}")
    if len(X) != len(y):
        raise ValueError(f"X and y must have the same number of rows; got {len(X)} and {len(y)}")


def validation_split(X, y, fraction: float = 0.2, seed=0):
    """(X_fit, y_fit, X_val, y_val): ``fraction`` of the rows of (X, y) held out for validation.

    The workflow of the lecture: fit on the rest, choose settings by the validation score,
    then report the test set once. Integer labels are split per class (stratified, as
    :func:`load_digits` splits off its test set: round(fraction * class size) rows of each
    class); float targets are split at random. Both parts keep at least one row.
    Returns copies in a seeded random order.
    """
    fraction = checks.real(fraction, "fraction", above=0, below=1)
    rng = checks.rng(seed)
    _check_rows(X, y)
    X, y = np.asarray(X), np.asarray(y)
    if y.ndim == 1 and y.dtype.kind in "iu":
        held = np.concatenate([idx[: int(round(fraction * len(idx)))]
                               for idx in (rng.permutation(np.flatnonzero(y == c)) for c in np.unique(y))])
    else:
        held = rng.permutation(len(X))[: int(round(fraction * len(X)))]
    if not 0 < len(held) < len(X):
        raise ValueError(f"fraction={fraction} of {len(X)} rows leaves an empty "
                         f"{'validation' if not len(held) else 'training'} part; use more rows or another fraction")
    is_val = np.zeros(len(X), dtype=bool)
    is_val[held] = True
    fit, val = rng.permutation(np.flatnonzero(~is_val)), rng.permutation(held)
    return X[fit], y[fit], X[val], y[val]


def shard(X, y, rank: int, size: int):
    """Rows of (X, y) owned by ``rank`` out of ``size``: contiguous blocks as equal as possible.

    The first ``n % size`` ranks get one extra row; the shards of all ranks, in rank order,
    concatenate back to (X, y). Returns views, not copies.
    """
    size = checks.integer(size, "size", at_least=1)
    checks.integer(rank, "rank", hint=" in [0, size)")
    if not 0 <= rank < size:
        raise ValueError(f"rank={rank}: must be in [0, size) = [0, {size})")
    _check_rows(X, y)
    if size > len(X):
        raise ValueError(f"size={size} exceeds the number of rows ({len(X)}); some ranks would get no data")
    base, extra = divmod(len(X), size)
    start = rank * base + min(rank, extra)
    stop = start + base + (rank < extra)
    return X[start:stop], y[start:stop]


def minibatches(X, y, batch_size: int, rng: np.random.Generator | None = None):
    """Yield (X_batch, y_batch) covering every row once; the last batch may be smaller.

    With ``rng`` the rows are shuffled first (one gather per epoch, then contiguous views,
    so the kernels get C-contiguous batches); without it they come in order.
    """
    batch_size = checks.integer(batch_size, "batch_size", at_least=1)
    _check_rows(X, y)
    if rng is not None:
        order = rng.permutation(len(X))
        X, y = X[order], y[order]
    for start in range(0, len(X), batch_size):
        yield X[start : start + batch_size], y[start : start + batch_size]
