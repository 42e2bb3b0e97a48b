"""Collectives on ThreadComm ranks equal their NumPy references (task: issue 4).

TIP: ``coursekit.comm.set_verbose()`` prints every send/recv of a failing case.
"""

import functools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coursekit import collectives as C
from coursekit.collectives.ops import OPS
from coursekit.comm import run_local

PS = range(1, 10)
LENGTHS = (0, 1, 7, 13)  # empty, fewer items than ranks, odd lengths


def contribution(rank, n, dtype=np.int64, seed=0):
    return np.random.default_rng([seed, rank]).integers(-9, 10, size=n).astype(dtype)


def reference(xs, op):
    return functools.reduce(OPS[op], xs)


def on_ranks(p, fn):
    return run_local(fn, p, timeout=10)


def assert_all_equal(results, expected):
    for rank, got in enumerate(results):
        assert got.dtype == expected.dtype, f"rank {rank}"
        np.testing.assert_array_equal(got, expected, err_msg=f"rank {rank}")


@pytest.mark.parametrize("algorithm", C.ALGORITHMS["allreduce"])
@pytest.mark.parametrize("op", sorted(OPS))
def test_allreduce(algorithm, op):
    for p in PS:
        for n in LENGTHS:
            xs = [contribution(r, n) for r in range(p)]
            out = on_ranks(p, lambda c: C.allreduce(c, xs[c.rank], op=op, algorithm=algorithm))
            assert_all_equal(out, reference(xs, op))


@pytest.mark.parametrize("algorithm", C.ALGORITHMS["allreduce"])
def test_allreduce_floats_bit_identical_on_every_rank(algorithm):
    xs = [np.random.default_rng([1, r]).standard_normal((3, 5)).astype(np.float32)
          for r in range(7)]
    out = on_ranks(7, lambda c: C.allreduce(c, xs[c.rank], algorithm=algorithm))
    np.testing.assert_allclose(out[0], np.sum(xs, axis=0), rtol=1e-5, atol=1e-6)
    assert out[0].shape == (3, 5)
    for got in out[1:]:
        assert got.tobytes() == out[0].tobytes()


@pytest.mark.parametrize("algorithm", C.ALGORITHMS["bcast"])
def test_bcast(algorithm):
    for p in PS:
        for n in LENGTHS:
            for root in {0, p // 2, p - 1}:
                x = contribution(root, n)
                out = on_ranks(p, lambda c: C.bcast(c, x if c.rank == root else None,
                                                    root=root, algorithm=algorithm))
                assert_all_equal(out, x)


def test_bcast_accepts_buffers_and_leaves_them_alone():
    buf = [np.full((2, 3), r, dtype=np.float64) for r in range(4)]
    out = on_ranks(4, lambda c: C.bcast(c, buf[c.rank], root=2, check=False))
    assert_all_equal(out, np.full((2, 3), 2.0))
    assert all((b == r).all() for r, b in enumerate(buf))


@pytest.mark.parametrize("algorithm", C.ALGORITHMS["reduce"])
@pytest.mark.parametrize("op", ["sum", "max"])
def test_reduce(algorithm, op):
    for p in PS:
        for n in LENGTHS:
            root = p - 1
            xs = [contribution(r, n) for r in range(p)]
            out = on_ranks(p, lambda c: C.reduce(c, xs[c.rank], root=root, op=op,
                                                 algorithm=algorithm))
            np.testing.assert_array_equal(out[root], reference(xs, op))
            assert all(o is None for r, o in enumerate(out) if r != root)


@pytest.mark.parametrize("algorithm", C.ALGORITHMS["reduce_scatter"])
def test_reduce_scatter(algorithm):
    for p in PS:
        for n in LENGTHS:
            xs = [contribution(r, n).reshape(n, 1) * [1, 2] for r in range(p)]
            out = on_ranks(p, lambda c: C.reduce_scatter(c, xs[c.rank], algorithm=algorithm))
            for got, want in zip(out, np.array_split(reference(xs, "sum"), p)):
                np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("algorithm", C.ALGORITHMS["allgather"])
def test_allgather(algorithm):
    for p in PS:
        for n in LENGTHS:
            xs = [contribution(r, n).reshape(-1, 1) for r in range(p)]
            out = on_ranks(p, lambda c: C.allgather(c, xs[c.rank], algorithm=algorithm))
            assert_all_equal(out, np.concatenate(xs))


@pytest.mark.parametrize("algorithm", C.ALGORITHMS["alltoall"])
def test_alltoall(algorithm):
    for p in PS:
        for n in LENGTHS:
            xs = [contribution(r, n) for r in range(p)]
            out = on_ranks(p, lambda c: C.alltoall(c, xs[c.rank], algorithm=algorithm))
            for r, got in enumerate(out):
                want = np.concatenate([np.array_split(x, p)[r] for x in xs])
                np.testing.assert_array_equal(got, want)


def test_scatter_and_gather():
    for p in PS:
        for n in LENGTHS:
            root = p // 2
            x = contribution(root, n).reshape(-1, 1)
            out = on_ranks(p, lambda c: C.scatter(c, x if c.rank == root else None, root=root))
            for got, want in zip(out, np.array_split(x, p)):
                np.testing.assert_array_equal(got, want)
            xs = [contribution(r, n) for r in range(p)]
            out = on_ranks(p, lambda c: C.gather(c, xs[c.rank], root=root))
            np.testing.assert_array_equal(out[root], np.concatenate(xs))
            assert all(o is None for r, o in enumerate(out) if r != root)


def test_allreduce_is_reduce_scatter_then_allgather_for_uneven_chunks():
    p, n = 5, 12  # chunks 3,3,2,2,2 are unequal: allgather of them needs equal shares
    xs = [contribution(r, n) for r in range(p)]
    pieces = on_ranks(p, lambda c: C.reduce_scatter(c, xs[c.rank]))
    np.testing.assert_array_equal(np.concatenate(pieces), reference(xs, "sum"))


DTYPES = st.sampled_from(["bool", "int8", "uint16", "int32", "float16", "float32",
                          "float64", "complex64"])


@settings(max_examples=25, deadline=None)
@given(p=st.integers(1, 9), n=st.integers(0, 20), dtype=DTYPES,
       op=st.sampled_from(sorted(OPS)), algorithm=st.sampled_from(C.ALGORITHMS["allreduce"]),
       seed=st.integers(0, 2**16))
def test_allreduce_any_dtype(p, n, dtype, op, algorithm, seed):
    if dtype.startswith("complex") and op in ("min", "max"):
        op = "sum"
    xs = [contribution(r, n, seed=seed) for r in range(p)]
    if op == "prod":  # factors 1 or 2: float16 must not overflow (inf * 0 would depend on order)
        xs = [np.abs(x) % 2 + 1 for x in xs]
    xs = [x.astype(dtype) for x in xs]
    out = on_ranks(p, lambda c: C.allreduce(c, xs[c.rank], op=op, algorithm=algorithm))
    want = reference(xs, op)
    for got in out:
        assert got.dtype == want.dtype
        np.testing.assert_allclose(got.astype(complex), want.astype(complex), rtol=1e-2)


def test_input_is_not_modified():
    xs = [np.arange(6.0) + r for r in range(3)]
    copies = [x.copy() for x in xs]
    on_ranks(3, lambda c: C.allreduce(c, xs[c.rank], algorithm="rabenseifner"))
    for x, y in zip(xs, copies):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("algorithm", C.ALGORITHMS["allreduce"])
def test_allreduce_in_place_and_into_out(algorithm):
    for p in (1, 3, 4, 5):
        xs = [contribution(r, 13, np.float64).reshape(13, 1) for r in range(p)]
        want = reference(xs, "sum")

        def body(c):
            mine = xs[c.rank].copy()
            inplace = C.allreduce(c, mine, algorithm=algorithm, out=mine)
            given = np.empty_like(mine)
            into = C.allreduce(c, xs[c.rank], algorithm=algorithm, out=given, check=False)
            return inplace is mine, into is given, mine, given, xs[c.rank]

        for rank, (same, same_out, mine, given, x) in enumerate(on_ranks(p, body)):
            assert same and same_out
            np.testing.assert_array_equal(mine, want)
            np.testing.assert_array_equal(given, want)
            np.testing.assert_array_equal(x, contribution(rank, 13, np.float64).reshape(13, 1))


def test_registry_names_defaults():
    assert set(C.ALGORITHMS) == set(C.COLLECTIVES) == set(C.FUNCTIONS)
    for name, default in C.DEFAULT_ALGORITHM.items():
        assert default in C.ALGORITHMS[name]
    assert set(C.ALGORITHMS["allreduce"]) == {"reduce_bcast", "ring", "recursive_doubling",
                                              "rabenseifner"}
