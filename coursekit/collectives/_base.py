"""Shared plumbing: chunking, the fold of non-power-of-two worlds, argument checks."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping

import numpy as np

from coursekit import checks
from coursekit.comm.base import Comm

from . import fingerprint
from .ops import OPS, get_op
from .tags import COLLECTIVES

_ABSENT = object()
"""``prepare``'s default for root and op: the collective has none (None is a bad value)."""

_SUPPORTED = tuple(np.dtype(s) for s in (
    "?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16"))


def chunk_bounds(n: int, p: int) -> list[int]:
    """Split ``n`` items into ``p`` nearly equal chunks, like ``np.array_split``.

    Returns ``p + 1`` offsets; chunk i is ``[b[i], b[i+1])``; the first ``n % p`` chunks get
    one extra item. Chunks may be empty when n < p.
    """
    q, r = divmod(n, p)
    return [i * q + min(i, r) for i in range(p + 1)]


def fold(p: int) -> tuple[int, int]:
    """``(p2, rem)``: the largest power of two ``p2 <= p`` and ``rem = p - p2``.

    Recursive doubling and Rabenseifner run on p2 ranks. The standard fold-in: among the
    first ``2 * rem`` ranks each even rank hands its data to the odd rank above it and
    waits; the odd rank becomes "new rank" r // 2. Ranks >= 2 * rem become r - rem.
    """
    p2 = 1 << (p.bit_length() - 1)
    return p2, p - p2


def new_rank(rank: int, p: int) -> int:
    """Rank among the p2 participants after the fold, or -1 for a folded-out even rank."""
    _, rem = fold(p)
    if rank < 2 * rem:
        return rank // 2 if rank % 2 else -1
    return rank - rem


def old_rank(new: int, p: int) -> int:
    """Inverse of :func:`new_rank`."""
    _, rem = fold(p)
    return 2 * new + 1 if new < rem else new + rem


def work_array(comm, n: int, dtype) -> np.ndarray:
    """An n-item work array of ``dtype`` for incoming chunks, reused across calls on ``comm``.

    Contents are undefined and it is overwritten by the next collective on ``comm``: never
    hand it to the caller. A fresh ``np.empty`` per call would cost a page fault per 4 KiB
    page on first touch (about 0.15 ms per MiB on the course machine), time that the
    alpha-beta-gamma model does not count; persistent buffers are what NCCL and MPI use.
    """
    nbytes = int(n) * np.dtype(dtype).itemsize
    buf = getattr(comm, "_collective_scratch", None)
    if buf is None or buf.nbytes < nbytes:
        buf = np.empty(max(nbytes, 16), np.uint8)
        comm._collective_scratch = buf
    return buf[:nbytes].view(dtype)


def check_dtype(arr: np.ndarray) -> np.ndarray:
    """Return ``arr`` with a native-endian supported numeric dtype, or raise TypeError."""
    if arr.dtype.kind in "biufc":
        native = arr.dtype.newbyteorder("=")
        if native in _SUPPORTED:
            return arr.astype(native, copy=False)
    allowed = ", ".join(str(d) for d in _SUPPORTED)
    raise TypeError(f"collectives work on numeric arrays; got dtype {arr.dtype}, "
                    f"allowed: {allowed}")


@dataclass(frozen=True)
class Call:
    """What a collective needs after its arguments were checked.

    ``impl``: the algorithm, :func:`guarded` (an error in it breaks the comm); ``x``: the
    local array (None where a rank passes none); ``ufunc``: the op (None for data-movement
    collectives); ``dtype``/``shape``: of the reference array (the root's, or every rank's).
    """

    impl: Callable
    x: np.ndarray | None
    ufunc: np.ufunc | None
    dtype: np.dtype
    shape: tuple


def prepare(comm, collective: str, algorithms: Mapping[str, Callable], algorithm, x, *,
            root=_ABSENT, op=_ABSENT, check: bool = True, min_ndim: int = 0,
            array_on: str = "all", out=None) -> Call:
    """Check a collective's arguments on this rank and, with ``check``, across ranks.

    ``array_on`` is "all" (every rank contributes an array), "root" (only the root's
    array matters: scatter) or "root+" (bcast: non-roots may pass None or a buffer of
    the root's shape and dtype). With ``check=True`` the ranks exchange a small
    fingerprint (:mod:`.fingerprint`) and every rank raises the same ValueError when the
    calls disagree, instead of hanging. A local argument error is held back until that
    exchange is done, so the other ranks learn about it too. With ``check=False`` nothing
    crosses the network and the caller promises MPI's contract: matching calls and
    buffers everywhere (bcast non-roots must then pass a buffer). ``out``, when given, must
    be able to hold the result: a writable C-contiguous array of ``x``'s shape and dtype.
    """
    check_comm(comm)
    check = checks.boolean(check, "check")
    problem = None
    impl = ufunc = arr = None
    try:
        impl = _algorithm(collective, algorithms, algorithm)
        if op is not _ABSENT:
            ufunc = get_op(op)
        if root is not _ABSENT:
            _check_root(root, comm.size)
        has_array = array_on == "all" or comm.rank == root or (array_on == "root+" and x is not None)
        if has_array:
            arr = check_dtype(np.asarray(x))
            if arr.ndim < min_ndim:
                raise ValueError(f"{collective} needs an array with at least {min_ndim} "
                                 f"dimension(s); got shape {arr.shape}")
            if arr.ndim > fingerprint.MAX_NDIM:
                raise ValueError(f"{collective} handles at most {fingerprint.MAX_NDIM} "
                                 f"dimensions; got {arr.ndim}")
            if out is not None:
                _check_out(collective, out, arr)
    except (TypeError, ValueError) as exc:
        problem = exc
    if not check:
        if problem is not None:
            raise problem
        if arr is None and array_on == "root+":
            raise TypeError("bcast with check=False needs a buffer of the root's shape and "
                            "dtype on every rank (with check=True non-roots may pass None)")
        ref = arr if arr is not None else np.empty(0)
        return Call(guarded(comm, collective, impl), arr, ufunc, ref.dtype, ref.shape)
    mine = fingerprint.describe(
        collective=COLLECTIVES.index(collective),
        algorithm=list(algorithms).index(algorithm) if impl else -1,
        root=root if isinstance(root, int) and problem is None else -1,
        op=list(OPS).index(op) if ufunc is not None else -1,
        array=arr, ok=problem is None)
    with comm.collective(collective):
        table = fingerprint.allgather_fingerprints(comm, mine)
    if problem is not None:
        raise problem
    dtype, shape = fingerprint.agree(table, collective, list(algorithms), root, array_on)
    return Call(guarded(comm, collective, impl), arr, ufunc, dtype, shape)


def guarded(comm, collective: str, impl: Callable) -> Callable:
    """``impl`` run inside ``comm.collective(collective)``: if it raises on this rank, the
    comm refuses every later call instead of letting the next collective match the
    messages this one left in flight (see :meth:`coursekit.comm.Comm.collective`)."""
    def run(*args):
        with comm.collective(collective):
            return impl(*args)
    return run


def check_comm(comm) -> None:
    """TypeError unless ``comm`` is a Comm (a collective's first argument)."""
    checks.instance(comm, "comm", Comm, " (the first argument: e.g. the comm that run_local "
                    "passes, or engine_comm() on an engine)")


def _algorithm(collective, algorithms, algorithm):
    if not isinstance(algorithm, str) or algorithm not in algorithms:
        raise ValueError(f"unknown {collective} algorithm {algorithm!r}; "
                         f"allowed: {list(algorithms)}")
    return algorithms[algorithm]


def _check_out(collective, out, arr):
    if not isinstance(out, np.ndarray):
        raise TypeError(f"{collective}(out=...) must be a NumPy array, got {type(out).__name__}")
    if out.shape != arr.shape or out.dtype != arr.dtype:
        raise ValueError(f"{collective}(out=...) must have the input's shape and dtype "
                         f"{arr.dtype}{arr.shape}; got {out.dtype}{out.shape}")
    if not (out.flags.c_contiguous and out.flags.writeable):
        raise ValueError(f"{collective}(out=...) must be writable and C-contiguous")


def _check_root(root, size):
    if isinstance(root, bool) or not isinstance(root, (int, np.integer)):
        raise TypeError(f"root must be an int rank, got {root!r}")
    if not 0 <= root < size:
        raise ValueError(f"root {root} is out of range: a world of {size} ranks has "
                         f"ranks 0..{size - 1}")
