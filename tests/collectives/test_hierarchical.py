"""Hierarchical allreduce equals the flat allreduce, on ThreadComm ranks and on engines."""

import numpy as np
import pytest

from coursekit import costmodel
from coursekit.collectives import allreduce
from coursekit.collectives.hierarchical import hierarchical_allreduce, node_groups
from coursekit.comm import run_local


def _both(comm, n, k, dtype, op):
    rng = np.random.default_rng([3, comm.rank])
    x = (rng.integers(-50, 50, n) if np.dtype(dtype).kind == "i"
         else rng.standard_normal(n)).astype(dtype)
    return hierarchical_allreduce(comm, x, op, ranks_per_node=k), allreduce(comm, x, op)


@pytest.mark.parametrize("p, k", [(4, 2), (6, 3), (6, 2), (8, 4), (3, 1), (3, 3), (12, 4)])
@pytest.mark.parametrize("n", [1, 7, 100])
def test_equals_flat_on_integers(p, k, n):
    results = run_local(_both, p, n, k, np.int64, "sum")
    for hier, flat in results:
        np.testing.assert_array_equal(hier, flat)


@pytest.mark.parametrize("op", ["sum", "max", "prod"])
def test_floats_close_to_flat_and_identical_across_ranks(op):
    results = run_local(_both, 8, 33, 2, np.float64, op)
    for hier, flat in results:
        np.testing.assert_allclose(hier, flat, rtol=1e-12)
        np.testing.assert_array_equal(hier, results[0][0])


def test_node_labels_group_noncontiguous_ranks():
    labels = ["b", "a", "b", "a"]
    assert node_groups(4, nodes=labels) == [[0, 2], [1, 3]]

    def fn(comm):
        x = np.full(5, comm.rank + 1, dtype=np.int64)
        return hierarchical_allreduce(comm, x, nodes=labels)
    for out in run_local(fn, 4):
        np.testing.assert_array_equal(out, np.full(5, 10))


def test_traffic_per_rank_matches_the_three_phases():
    """Each rank sends 2(k-1) intra chunks and 2(m-1) inter chunks of n/(k m) bytes."""
    p, k, n_items = 8, 4, 64

    def fn(comm):
        comm.tracing = True
        hierarchical_allreduce(comm, np.ones(n_items, np.float32), ranks_per_node=k,
                               check=False)
        return list(comm.trace)
    measured = costmodel.measured_traffic(run_local(fn, p))
    m = p // k
    assert measured.messages.tolist() == [2 * (k - 1) + 2 * (m - 1)] * p
    chunk = 4 * n_items // k
    assert measured.nbytes.tolist() == [2 * (k - 1) * chunk + 2 * (m - 1) * chunk // m] * p


@pytest.mark.parametrize("kwargs, match", [
    (dict(ranks_per_node=3), "divisor"), (dict(), "exactly one"),
    (dict(ranks_per_node=2, nodes=["a"] * 4), "exactly one"),
    (dict(nodes=["a", "a", "a", "b"]), "same number"), (dict(nodes=["a"]), "one per rank"),
    (dict(ranks_per_node=2, inter="hypercube"), "inter-node allreduce algorithm"),
])
def test_bad_grouping(kwargs, match):
    def fn(comm):
        return hierarchical_allreduce(comm, np.ones(3), **kwargs)
    with pytest.raises(ValueError, match=match):
        run_local(fn, 4, timeout=5)


def test_mismatched_shapes_raise_on_every_rank():
    def fn(comm):
        return hierarchical_allreduce(comm, np.ones(3 + comm.rank), ranks_per_node=2)
    with pytest.raises(ValueError):
        run_local(fn, 4, timeout=5)


def test_on_engines_grouped_by_fake_nodes(cluster4):
    """Real engines (ZMQ between processes), two pretend nodes of two engines each. The
    engines cannot import this test module, so library functions run there directly."""
    from coursekit.comm import setup_comm
    from coursekit.cluster.runner import ClusterRunner

    x = np.arange(10, dtype=np.int64)
    c = cluster4  # the run's shared 4-engine cluster
    setup_comm(c)
    engines = ClusterRunner(c)
    hier = engines.run(hierarchical_allreduce, x, nodes=["n0", "n0", "n1", "n1"])
    flat = engines.run(allreduce, x)
    for h, f in zip(hier, flat):
        np.testing.assert_array_equal(h, f)
        np.testing.assert_array_equal(h, 4 * x)
