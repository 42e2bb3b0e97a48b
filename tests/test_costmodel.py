"""The cost model agrees with what the algorithms really send (issue 4, DESIGN contract 2)."""

import math

import numpy as np
import pytest

from coursekit import collectives as C
from coursekit import costmodel as cm
from coursekit.collectives.fingerprint import FINGERPRINT_BYTES
from coursekit.collectives.tags import FINGERPRINT_TAG
from coursekit.comm import run_local

PAIRS = [(c, a) for c, algos in C.ALGORITHMS.items() for a in algos]
ROOTED = ("bcast", "scatter", "gather", "reduce")
SHARED = ("gather", "allgather")  # n is the gathered total: p shares of `items` each


def traced(collective, algorithm, p, items, root, check=False):
    """Run one collective on p ThreadComm ranks with float32 data; return the traces."""
    def body(comm):
        comm.tracing = True
        x = np.arange(items, dtype=np.float32)
        kw = {"root": root} if collective in ROOTED else {}
        C.FUNCTIONS[collective](comm, x, algorithm=algorithm, check=check, **kw)
        return comm.trace
    return run_local(body, p, timeout=10)


@pytest.mark.parametrize("collective,algorithm", PAIRS)
def test_traced_messages_and_bytes_equal_the_model(collective, algorithm):
    for p in range(1, 10):
        for items in (0, 5, 16, 37):
            root = p // 2
            total = items * (p if collective in SHARED else 1)
            want = cm.traffic(collective, algorithm, p, 4 * total, root=root, itemsize=4)
            got = cm.measured_traffic(traced(collective, algorithm, p, items, root))
            np.testing.assert_array_equal(got.messages, want.messages, err_msg=f"p={p}")
            np.testing.assert_array_equal(got.nbytes, want.nbytes, err_msg=f"p={p}")


def test_ring_allreduce_counts_from_the_issue():
    for p in range(1, 10):
        t = cm.traffic("allreduce", "ring", p, 4 * 12 * p, itemsize=4)
        assert (t.messages == 2 * (p - 1)).all()
        assert np.allclose(t.nbytes, 2 * (p - 1) / p * 4 * 12 * p)


# Busiest sender == the formula's alpha and beta coefficients (p a power of two, n divisible
# by p). Not for reduce/gather (the root's *receives* are the bottleneck) nor linear
# allgather/alltoall (p-1 messages per rank overlap in the model).
SENDER_BOUND = [("bcast", "linear"), ("bcast", "binomial"), ("allreduce", "ring"),
                ("allreduce", "recursive_doubling"), ("allreduce", "rabenseifner"),
                ("reduce_scatter", "ring"), ("allgather", "ring"),
                ("allgather", "recursive_doubling"), ("alltoall", "pairwise")]


@pytest.mark.parametrize("collective,algorithm", SENDER_BOUND)
def test_formula_coefficients_match_busiest_rank(collective, algorithm):
    for p in (1, 2, 4, 8):
        n = 64 * p
        t = cm.traffic(collective, algorithm, p, n)
        alpha_coef = cm.predict(collective, algorithm, p, n, alpha=1.0, beta=0.0)
        beta_coef = cm.predict(collective, algorithm, p, n, alpha=0.0, beta=1.0)
        assert t.messages.max() == alpha_coef
        assert math.isclose(t.nbytes.max(), beta_coef)


def test_formulas_by_hand():
    a, b, g, n = 1e-6, 1e-9, 1e-10, 1e6
    assert math.isclose(cm.predict("allreduce", "ring", 4, n, a, b, g),
                        6 * a + 1.5 * n * b + 0.75 * n * g)
    assert math.isclose(cm.predict("bcast", "binomial", 5, n, a, b), 3 * (a + n * b))
    assert math.isclose(cm.predict("allreduce", "rabenseifner", 8, n, a, b, g),
                        6 * a + 1.75 * n * b + 0.875 * n * g)
    assert math.isclose(cm.predict("allreduce", "recursive_doubling", 6, n, a, b, g),
                        4 * (a + n * b) + 3 * n * g)
    for c, alg in PAIRS:
        assert cm.predict(c, alg, 1, n, a, b, g) == 0.0
    sizes = np.array([1e3, 1e6])
    assert cm.predict("allgather", "ring", 4, sizes, a, b).shape == (2,)


def test_ring_beats_tree_for_large_messages_only():
    a, b = 5e-6, 1e-9
    small = [cm.predict("allreduce", alg, 16, 64, a, b) for alg in ("ring", "recursive_doubling")]
    large = [cm.predict("allreduce", alg, 16, 1 << 26, a, b) for alg in ("ring", "recursive_doubling")]
    assert small[0] > small[1] and large[0] < large[1]


def test_fingerprint_adds_log_p_small_messages():
    for p in range(1, 10):
        traces = traced("allreduce", "ring", p, 10, 0, check=True)
        fp = cm.measured_traffic(traces, tags=[FINGERPRINT_TAG])
        assert (fp.messages == math.ceil(math.log2(p)) if p > 1 else fp.messages == 0).all()
        assert (fp.nbytes == (p - 1) * FINGERPRINT_BYTES).all()


def test_fit_recovers_alpha_beta():
    rng = np.random.default_rng(0)
    sizes = np.logspace(0, 8, 30)
    times = (2e-6 + 1e-9 * sizes) * (1 + 0.01 * rng.standard_normal(30))
    link = cm.fit(sizes, times)
    assert math.isclose(link.alpha, 2e-6, rel_tol=0.05)
    assert math.isclose(link.beta, 1e-9, rel_tol=0.05)
    assert math.isclose(link.bandwidth, 1e9, rel_tol=0.05)
    assert math.isclose(link(1e6), 2e-6 + 1e-3, rel_tol=0.05)


def test_busbw_follows_nccl_tests():
    assert cm.algbw(1e9, 2.0) == 5e8
    assert cm.busbw("allreduce", 4, 1e9, 1.0) == 1.5e9
    assert cm.busbw("allgather", 4, 1e9, 1.0) == 0.75e9
    assert cm.busbw("bcast", 4, 1e9, 1.0) == 1e9
    # a bandwidth-optimal ring at link speed 1/beta shows busbw -> 1/beta as n grows
    t = cm.predict("allreduce", "ring", 8, 1e9, alpha=0.0, beta=1e-9)
    assert math.isclose(cm.busbw("allreduce", 8, 1e9, t), 1e9)


@pytest.mark.parametrize("args,match", [
    (("allreduce", "tree", 4, 10), "allowed: \\['rabenseifner'"),
    (("allsum", "ring", 4, 10), "unknown collective"),
    (("allreduce", "ring", 0, 10), "positive int"),
    (("allreduce", "ring", 4, -1), ">= 0"),
])
def test_bad_arguments(args, match):
    with pytest.raises(ValueError, match=match):
        cm.predict(*args, alpha=1, beta=1)
    with pytest.raises(ValueError, match="two different"):
        cm.fit([8, 8], [1, 2])


@pytest.mark.parametrize("p", [4, 8, 16, 64])
@pytest.mark.parametrize("gamma", [0.0, 3e-11])
def test_crossover_recursive_doubling_ring_is_the_closed_form(p, gamma):
    """Chapter 2: recursive doubling beats the ring below n*, the ring wins above it."""
    a, b = 50e-6, 1e-9
    lg, f = math.log2(p), (p - 1) / p
    closed = (2 * (p - 1) - lg) * a / ((lg - 2 * f) * b + (lg - f) * gamma)
    n = cm.crossover("allreduce", "recursive_doubling", "ring", p, a, b, gamma)
    assert n == pytest.approx(closed, rel=1e-9)
    if p == 4 and gamma == 0:
        assert n == pytest.approx(8 * a / b)
    rd, ring = (cm.predict("allreduce", alg, p, np.array([n / 2, n, 2 * n]), a, b, gamma)
                for alg in ("recursive_doubling", "ring"))
    assert rd[0] < ring[0] and rd[1] == pytest.approx(ring[1]) and rd[2] > ring[2]


def test_crossover_never_and_always():
    a, b, g = 50e-6, 1e-9, 3e-11
    # p = 2, no reduction cost: RD (a + n b) is never slower than the ring (2 a + n b)
    assert cm.crossover("allreduce", "recursive_doubling", "ring", 2, a, b) == math.inf
    # with gamma the ring's half-size reduction wins above 2 alpha / gamma
    assert cm.crossover("allreduce", "recursive_doubling", "ring", 2, a, b, g) == pytest.approx(2 * a / g)
    # reduce + bcast (2 lg (a + n b)) never beats recursive doubling, at any p
    for p in (2, 3, 4, 8, 13):
        assert cm.crossover("allreduce", "recursive_doubling", "reduce_bcast", p, a, b, g) == math.inf
        assert cm.crossover("allreduce", "reduce_bcast", "recursive_doubling", p, a, b, g) == 0.0
    # Rabenseifner has the ring's bandwidth terms with 2 lg p <= 2(p-1) latencies: never slower
    for p in (2, 4, 8, 16):
        assert cm.crossover("allreduce", "ring", "rabenseifner", p, a, b, g) == 0.0
    # and it overtakes recursive doubling at lg alpha / ((lg - 2f) beta + (lg - f) gamma)
    assert cm.crossover("allreduce", "recursive_doubling", "rabenseifner", 8, a, b, g) == \
        pytest.approx(3 * a / ((3 - 1.75) * b + (3 - 0.875) * g))


def test_crossover_errors():
    a, b = 50e-6, 1e-9
    with pytest.raises(ValueError, match="call crossover\\(..., 'recursive_doubling', 'ring'"):
        cm.crossover("allreduce", "ring", "recursive_doubling", 4, a, b)
    with pytest.raises(ValueError, match="unknown allreduce algorithm 'tree'"):
        cm.crossover("allreduce", "ring", "tree", 4, a, b)
    with pytest.raises(ValueError, match="alpha"):
        cm.crossover("allreduce", "ring", "rabenseifner", 4, float("nan"), b)
