"""The cross-rank argument check behind ``check=True``.

Before a collective moves any data, every rank publishes a fingerprint of its call (which
collective, algorithm, root, op, and its array's dtype and shape) and gathers everyone
else's, with a dissemination allgather (Bruck): ceil(log2 p) rounds; in round k each
rank sends the fingerprints it holds, min(2^k, p - 2^k) of them, to rank - 2^k and
receives as many from rank + 2^k. Cost: ceil(log2 p) alpha + (p-1) * FINGERPRINT_BYTES
beta, tiny next to the data for large messages; pass ``check=False`` to skip it.

Every rank then holds the same table and draws the same conclusion, so a mismatch (a
different shape on one rank, a different root, a rank that called another collective)
raises the same ValueError on every rank instead of a hang or a wrong answer. PyTorch's
TORCH_DISTRIBUTED_DEBUG=DETAIL and Horovod's coordinator do the same check.
"""

from __future__ import annotations

import numpy as np

from .ops import OPS
from .tags import COLLECTIVES, FINGERPRINT_TAG as TAG

MAX_NDIM = 32
_MAGIC = 0x434B4650  # "CKFP"
_FIXED = 8
FINGERPRINT_BYTES = 8 * (_FIXED + MAX_NDIM)
"""Size of one fingerprint on the wire (int64 words)."""

def describe(*, collective: int, algorithm: int, root: int, op: int,
             array: np.ndarray | None, ok: bool) -> np.ndarray:
    """This rank's fingerprint: ``[magic, ok, collective, algorithm, root, op, dtype, ndim, shape...]``."""
    fp = np.full(_FIXED + MAX_NDIM, -1, dtype=np.int64)
    fp[:6] = (_MAGIC, int(ok), collective, algorithm, root, op)
    if array is not None:
        fp[6] = int.from_bytes(array.dtype.str.encode().ljust(8, b"\0"), "little")
        fp[7] = array.ndim
        fp[_FIXED:_FIXED + array.ndim] = array.shape
    return fp


def allgather_fingerprints(comm, fp: np.ndarray) -> np.ndarray:
    """Dissemination allgather: row i of the result is rank i's fingerprint."""
    p, r = comm.size, comm.rank
    table = np.empty((p, fp.size), dtype=np.int64)
    table[0] = fp  # table[i] holds rank (r + i) % p
    dist = 1
    while dist < p:
        count = min(dist, p - dist)
        comm.sendrecv(table[:count], (r - dist) % p, source=(r + dist) % p,
                      sendtag=TAG, recvtag=TAG, out=table[dist:dist + count])
        dist *= 2
    return np.roll(table, r, axis=0)


def _array(fp) -> tuple[np.dtype, tuple] | None:
    if fp[7] < 0:
        return None
    code = int(fp[6]).to_bytes(8, "little").rstrip(b"\0").decode()
    return np.dtype(code), tuple(int(s) for s in fp[_FIXED:_FIXED + fp[7]])


def _fmt(arr) -> str:
    return "None" if arr is None else f"{arr[0]}{arr[1]}"


def _ranks_by_value(values, fmt, ranks=None) -> str:
    groups: dict = {}
    for rank, value in zip(ranks or range(len(values)), values):
        groups.setdefault(value, []).append(rank)
    return "; ".join(f"rank{'s' if len(rs) > 1 else ''} {','.join(map(str, rs))}: {fmt(v)}"
                     for v, rs in groups.items())


def agree(table: np.ndarray, collective: str, algorithms: list[str], root, array_on: str):
    """Raise ValueError unless every rank made the same call with compatible arrays.

    Returns the reference ``(dtype, shape)``: the root's array for bcast and scatter,
    everyone's otherwise.
    """
    if not (table[:, 0] == _MAGIC).all():
        raise ValueError(f"{collective}: received a corrupt fingerprint; did another rank "
                         f"send a message with reserved tag {TAG}?")
    bad = [r for r in range(len(table)) if not table[r, 1]]
    if bad:
        raise ValueError(f"{collective} aborted on every rank: rank(s) {bad} passed invalid "
                         "arguments (each of them raised its own error saying which)")
    names = {2: ("collective", lambda i: COLLECTIVES[i]),
             3: ("algorithm", lambda i: repr(algorithms[i])),
             4: ("root", str),
             5: ("op", lambda i: repr(list(OPS)[i]))}
    for col, (what, fmt) in names.items():
        if len(set(table[:, col])) > 1:
            raise ValueError(f"{collective}: the ranks disagree on the {what}: "
                             + _ranks_by_value(table[:, col].tolist(), fmt))
    arrays = [_array(fp) for fp in table]
    if array_on == "all":
        if len(set(arrays)) > 1:
            raise ValueError(f"{collective} needs the same dtype and shape on every rank; got "
                             + _ranks_by_value(arrays, _fmt))
        return arrays[0]
    ref = arrays[root]
    if array_on == "root+":
        wrong = [r for r, a in enumerate(arrays) if a is not None and a != ref]
        if wrong:
            raise ValueError(f"{collective}: non-root ranks pass None or a buffer with the "
                             f"root's dtype and shape {_fmt(ref)}; got "
                             + _ranks_by_value([arrays[r] for r in wrong], _fmt, wrong))
    return ref
