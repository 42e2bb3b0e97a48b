"""Bad input to a collective: the same clear error on every rank, never a hang (issue 4)."""

import numpy as np
import pytest

from coursekit import collectives as C
from coursekit.comm import run_local


def errors_on_every_rank(p, fn):
    """Run fn on p ranks; return each rank's exception (a rank that returns fails the test)."""
    def body(comm):
        try:
            fn(comm)
        except (ValueError, TypeError) as exc:
            return exc
        return None
    out = run_local(body, p, timeout=5)
    assert all(isinstance(e, (ValueError, TypeError)) for e in out), out
    return out


def test_mismatched_shape_raises_on_every_rank():
    errs = errors_on_every_rank(
        4, lambda c: C.allreduce(c, np.ones(3 + (c.rank == 2), np.float32)))
    for e in errs:
        assert "same dtype and shape" in str(e) and "rank 2: float32(4,)" in str(e)


@pytest.mark.parametrize("out, why", [
    (np.ones(3, np.float64), "must have the input's shape and dtype float32(3,)"),
    (np.ones(4, np.float32), "float32(3,); got float32(4,)"),
    (np.ones(6, np.float32)[::2], "writable and C-contiguous"),
    ([0.0, 0.0, 0.0], "must be a NumPy array"),
])
def test_allreduce_out_that_cannot_hold_the_result_fails_on_every_rank(out, why):
    errs = errors_on_every_rank(
        3, lambda c: C.allreduce(c, np.ones(3, np.float32), out=out if c.rank == 1 else None))
    assert why in str(errs[1])
    assert all("rank(s) [1] passed invalid arguments" in str(e) for e in errs[::2])


def test_mismatched_dtype_raises_on_every_rank():
    errs = errors_on_every_rank(
        3, lambda c: C.allgather(c, np.ones(2, np.float32 if c.rank else np.float64)))
    assert all("rank 0: float64(2,)" in str(e) for e in errs)


def test_bcast_buffer_of_wrong_shape():
    errs = errors_on_every_rank(3, lambda c: C.bcast(c, np.ones(3 if c.rank == 0 else 4)))
    assert all("root's dtype and shape float64(3,)" in str(e) for e in errs)


def test_ranks_disagree_on_root_or_collective():
    errs = errors_on_every_rank(3, lambda c: C.bcast(c, np.ones(2), root=c.rank))
    assert all("disagree on the root" in str(e) for e in errs)
    errs = errors_on_every_rank(
        3, lambda c: C.allreduce(c, np.ones(2)) if c.rank else C.bcast(c, np.ones(2)))
    assert all("disagree on the collective" in str(e) for e in errs)


@pytest.mark.parametrize("root", [-1, 4, 99])
def test_root_out_of_range(root):
    errs = errors_on_every_rank(4, lambda c: C.reduce(c, np.ones(2), root=root))
    assert all("out of range" in str(e) and "0..3" in str(e) for e in errs)


def test_unknown_algorithm_on_one_rank_reaches_all():
    errs = errors_on_every_rank(
        3, lambda c: C.allreduce(c, np.ones(2), algorithm="tree" if c.rank == 1 else "ring"))
    assert "allowed: ['ring', 'reduce_bcast', 'recursive_doubling', 'rabenseifner']" in str(errs[1])
    assert "rank(s) [1] passed invalid arguments" in str(errs[0])


def test_unknown_op_lists_allowed():
    errs = errors_on_every_rank(2, lambda c: C.allreduce(c, np.ones(2), op="mean"))
    assert all("allowed ops: ['max', 'min', 'prod', 'sum']" in str(e) for e in errs)


def test_non_numeric_dtype_is_a_type_error():
    errs = errors_on_every_rank(2, lambda c: C.allreduce(c, np.array(["a", "b"])))
    assert all(isinstance(e, TypeError) and "allowed: bool" in str(e) for e in errs)


def test_unchecked_bcast_needs_a_buffer():
    """check=False is MPI's contract: the local error is immediate, other ranks see nothing."""
    with pytest.raises(TypeError, match="check=False needs a buffer"):
        run_local(lambda c: C.bcast(c, None if c.rank else np.ones(2), check=False), 2,
                  timeout=5)
