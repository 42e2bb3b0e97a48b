"""Argument checks shared by every chapter: one rule and one wording (DESIGN.md contract 7).

The wrong *type* raises TypeError, a value of the right type that is not allowed raises
ValueError, and both messages name the parameter and say what is allowed::

    epochs must be an integer >= 1; got 2.5        (TypeError)
    epochs=0: must be >= 1                         (ValueError)
    lr=nan: must be a finite number > 0            (ValueError)

``bool`` is never taken for a number (``epochs=True`` is a slip, not 1), and a string
that spells a number is not a number. Checks run before any work, so a bad value fails
at once, not deep inside NumPy or later on every rank of a cluster.
"""

from __future__ import annotations

import math
import numbers
import os

import numpy as np

__all__ = ["boolean", "callback", "cluster", "data_pair", "fits_in_memory", "float_dtype",
           "instance", "integer", "path", "rank_list", "real", "real_array", "rng"]

FLOAT_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))
"""The dtypes a model's parameters and a data set's features may have."""


def _bounds(low, high, low_open: bool, high_open: bool) -> str:
    """``">= 1"``, ``"> 0"``, ``"<= 16"`` or ``"in [0, 1)"``; "" when unbounded."""
    def show(v):  # integers in full (1048576, not 1.04858e+06)
        return str(int(v)) if isinstance(v, numbers.Integral) else f"{v:g}"

    if low is not None and high is not None:
        return f"in {'(' if low_open else '['}{show(low)}, {show(high)}{')' if high_open else ']'}"
    if low is not None:
        return f"{'>' if low_open else '>='} {show(low)}"
    if high is not None:
        return f"{'<' if high_open else '<='} {show(high)}"
    return ""


def _is_number(value, kind) -> bool:
    return isinstance(value, kind) and not isinstance(value, (bool, np.bool_))


def integer(value, name: str, at_least: int | None = None, at_most: int | None = None,
            hint: str = "") -> int:
    """``value`` as an int in [at_least, at_most] (either bound may be None).

    ``hint`` is appended to both messages, e.g. ``" (the number of workers)"``.
    """
    bounds = _bounds(at_least, at_most, False, False)
    if not _is_number(value, numbers.Integral):
        raise TypeError(f"{name} must be an integer{' ' + bounds if bounds else ''}{hint}; "
                        f"got {value!r:.60}")
    if (at_least is not None and value < at_least) or (at_most is not None and value > at_most):
        raise ValueError(f"{name}={value!r:.60}: must be {bounds}{hint}")
    return int(value)


def real(value, name: str, *, above=None, at_least=None, below=None, at_most=None,
         finite: bool = True, hint: str = "") -> float:
    """``value`` as a float within the bounds given (``above`` / ``below`` exclude the bound).

    NaN is never allowed; infinities only with ``finite=False``.
    """
    low = above if above is not None else at_least
    high = below if below is not None else at_most
    bounds = _bounds(low, high, above is not None, below is not None)
    if not _is_number(value, numbers.Real):
        raise TypeError(f"{name} must be a real number{' ' + bounds if bounds else ''}{hint}; "
                        f"got {value!r:.60}")
    try:
        x = float(value)
    except OverflowError:  # an int too large for a float
        x = math.inf if value > 0 else -math.inf
    number = not math.isnan(x) and (not finite or math.isfinite(x))
    inside = ((low is None or x > low or (above is None and x == low))
              and (high is None or x < high or (below is None and x == high)))
    if not (number and inside):
        what = f"a finite number {bounds}" if not number else bounds
        raise ValueError(f"{name}={value!r:.60}: must be {what.strip()}{hint}")
    return x


def real_array(values, name: str, *, above=None, at_least=None) -> np.ndarray:
    """``values`` (a number or an array-like of numbers) as a float array, every element
    finite and above / at least the bound given."""
    arr = np.asarray(values)
    if arr.dtype.kind not in "iuf":
        raise TypeError(f"{name} must be real numbers (a number or an array of them); got "
                        f"{values!r:.60}")
    arr = arr.astype(float)
    low = above if above is not None else at_least
    bounds = _bounds(low, None, above is not None, False)
    ok = np.isfinite(arr) & ((arr > low) if above is not None else
                             (arr >= low) if at_least is not None else True)
    if not ok.all():
        raise ValueError(f"{name} must be {bounds + ' and ' if bounds else ''}finite; got "
                         f"{values!r:.60}")
    return arr


def boolean(value, name: str) -> bool:
    """``value`` if it is True or False (a string such as "no" would silently mean True)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be True or False; got {value!r:.60}")
    return bool(value)


def instance(value, name: str, kind: type, how: str = ""):
    """``value`` if it is a ``kind``; else a TypeError that says how to make one."""
    if not isinstance(value, kind):
        raise TypeError(f"{name} must be a {kind.__name__}{how}; got {type(value).__name__} "
                        f"{value!r:.60}")
    return value


def rng(seed, name: str = "seed") -> np.random.Generator:
    """A Generator from an int seed >= 0 (the same seed, the same numbers) or a Generator."""
    if isinstance(seed, np.random.Generator):
        return seed
    if not _is_number(seed, numbers.Integral):
        raise TypeError(f"{name} must be a np.random.Generator or an int seed >= 0; got "
                        f"{seed!r:.60}")
    if seed < 0:
        raise ValueError(f"{name}={seed!r}: must be a np.random.Generator or an int seed >= 0")
    return np.random.default_rng(int(seed))


def float_dtype(dtype, name: str = "dtype") -> np.dtype:
    """``dtype`` as a NumPy dtype if it is float32 or float64 (anything else would truncate
    the data or the weights: ``int32`` silently, ``float16`` to 3 digits)."""
    try:
        dt = np.dtype(dtype)
    except TypeError:
        dt = None
    if dtype is None or dt is None or dt not in FLOAT_DTYPES:  # (None == float64 in NumPy)
        raise ValueError(f"{name}={dtype!r:.60} is not supported; allowed: float32, float64")
    return dt


def rank_list(members, name: str, size: int) -> list[int]:
    """``members`` as a list of distinct integer ranks in [0, size), at least one.

    A float such as 1.5 is a TypeError, not rank 1: ``int()`` would silently truncate it.
    """
    if isinstance(members, (str, bytes)) or not hasattr(members, "__iter__"):
        raise TypeError(f"{name} must be a list of distinct integer ranks in [0, {size}); "
                        f"got {members!r:.60}")
    items = list(members)
    for i, m in enumerate(items):
        if not _is_number(m, numbers.Integral):
            raise TypeError(f"{name}[{i}]={m!r:.60}: ranks must be integers in [0, {size})")
    ranks = [int(m) for m in items]
    if not ranks or len(set(ranks)) != len(ranks) or not all(0 <= m < size for m in ranks):
        raise ValueError(f"{name} must be distinct ranks of this comm, at least one, each in "
                         f"[0, {size}) (0..{size - 1}); got {ranks!r:.80}")
    return ranks


def memory_limit() -> int:
    """Bytes of memory of this machine (the cap :func:`fits_in_memory` compares with)."""
    import psutil
    return int(psutil.virtual_memory().total)


def _human(nbytes: int) -> str:
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.3g} {unit}"
    return f"{nbytes} B"


def fits_in_memory(nbytes: int, name: str, what: str) -> int:
    """``nbytes`` if that many bytes fit in this machine's memory; else a ValueError that
    names ``name`` (the parameter(s) that asked for it), ``what`` it is and the bytes, instead
    of a MemoryError (or the machine swapping) once the allocation is tried."""
    nbytes, limit = int(nbytes), memory_limit()
    if nbytes > limit:
        raise ValueError(f"{name}: {what} would need {nbytes:,} bytes ({_human(nbytes)}), more "
                         f"than this machine's memory ({limit:,} bytes, {_human(limit)}); "
                         f"allowed: sizes whose arrays fit in memory")
    return nbytes


def path(value, name: str, *, optional: bool = False):
    """``value`` if it is a path (a ``str`` or a ``pathlib.Path``/``os.PathLike``), not
    empty; with ``optional`` None is allowed too. A number or a list is a TypeError here,
    not an error deep inside pathlib when the first file is written."""
    if value is None and optional:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise TypeError(f"{name} must be a path (a str or a pathlib.Path)"
                        f"{' or None' if optional else ''}; got {type(value).__name__} "
                        f"{value!r:.60}")
    if not os.fspath(value):
        raise ValueError(f"{name}={value!r}: must be a non-empty path (a directory name)")
    return value


def callback(fn, name: str, signature: str = "(data)"):
    """``fn`` if it is callable or None (a string such as "print" would only fail when the
    first update arrives)."""
    if fn is not None and not callable(fn):
        raise TypeError(f"{name} must be a function {name}{signature} or None; got "
                        f"{type(fn).__name__} {fn!r:.60}")
    return fn


def data_pair(data, name: str = "data", *, features: int | None = None):
    """``data`` as an ``(X, y)`` pair of arrays: a tuple of two, X 2-D with at least one
    row of finite real numbers (``features`` columns when given), y one entry per row."""
    if not (isinstance(data, tuple) and len(data) == 2):
        raise TypeError(f"{name} must be an (X, y) pair (a tuple of two arrays); got "
                        f"{type(data).__name__} {data!r:.60}")
    X, y = np.asarray(data[0]), np.asarray(data[1])
    if X.dtype.kind not in "iuf":
        raise TypeError(f"{name}: X must hold real numbers; got dtype {X.dtype}")
    if X.ndim != 2 or X.shape[0] == 0:
        raise ValueError(f"{name}: X must be 2-D (n_samples, n_features) with at least one "
                         f"row; got shape {X.shape}")
    if y.ndim == 0 or len(y) != len(X):
        raise ValueError(f"{name}: X and y must have the same number of rows; got {len(X)} "
                         f"and {y.shape[0] if y.ndim else 'a scalar'}")
    if features is not None and X.shape[1] != features:
        raise ValueError(f"{name}: X has {X.shape[1]} features (columns); allowed: "
                         f"{features}, the model's input width sizes[0]")
    if y.dtype.kind not in "iuf":
        raise TypeError(f"{name}: y must hold labels or targets (numbers); got dtype {y.dtype}")
    for part, arr in (("X", X), ("y", y)):
        if arr.dtype.kind == "f" and not np.isfinite(arr).all():
            raise ValueError(f"{name}: {part} holds NaN or inf; allowed: finite numbers")
    return X, y


def cluster(value, name: str = "cluster"):
    """``value`` if it is a running coursekit cluster (what ``coursekit.cluster.start`` or
    ``cluster.connect`` returns); else a TypeError, or a ValueError once it was stopped."""
    if not (hasattr(value, "engine_ids") and callable(getattr(value, "run", None))):
        raise TypeError(f"{name} must be a coursekit cluster (coursekit.cluster.start(n) or "
                        f"coursekit.cluster.connect()); got {type(value).__name__} "
                        f"{value!r:.60}")
    if getattr(value, "_stopped", False):
        raise ValueError(f"{name} was stopped; allowed: a running cluster (start or connect "
                         f"a new one)")
    return value
