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

import numpy as np

__all__ = ["boolean", "instance", "integer", "real", "real_array", "rng"]


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
