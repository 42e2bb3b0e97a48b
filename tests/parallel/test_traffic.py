"""The bytes chapter 5 prints equal the traffic formulas of coursekit.parallel.traffic."""

import numpy as np
import pytest

from coursekit.collectives.tags import FINGERPRINT_TAG
from coursekit.comm import run_local
from coursekit.comm.trace import recording
from coursekit.costmodel import measured_traffic
from coursekit.nn import MLP
from coursekit.parallel import traffic
from coursekit.parallel.pipeline import execute, schedule
from coursekit.parallel.tensor_parallel import TensorParallelMLP, layer_split


def batch(n=7, n_in=6, n_classes=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, n_in)), rng.integers(0, n_classes, n)


def traced(comm, task, *args):
    with recording(comm) as messages:
        task(comm, *args)
        return list(messages())  # read inside the block


def payload_and_checks(traces):
    """(payload bytes per rank, fingerprint bytes per rank)."""
    fp = measured_traffic(traces, tags=[FINGERPRINT_TAG]).nbytes
    return measured_traffic(traces).nbytes - fp, fp


def tp(comm, mlp, X, y):
    TensorParallelMLP(comm, mlp).loss_and_grad(X, y)


# 4 layers end row-parallel; 3 end column-parallel (an allgather of the output)
@pytest.mark.parametrize("sizes", [[6, 12, 12, 12, 6], [6, 12, 6, 12]])
@pytest.mark.parametrize("p", [2, 3])
def test_tensor_parallel_sends_2_p_minus_1_over_p_of_the_activations(sizes, p):
    mlp = MLP(sizes, dtype=np.float64, seed=1)
    X, y = batch()
    payload, fp = payload_and_checks(run_local(traced, p, tp, mlp, X, y))
    want = traffic.tensor_parallel_bytes(sizes, len(X), p)
    np.testing.assert_array_equal(payload, want)
    n_calls = len(traffic.tensor_parallel_collectives(sizes))
    np.testing.assert_array_equal(fp, traffic.fingerprint_bytes(n_calls, p))
    if sizes == [6, 12, 12, 12, 6]:  # only allreduces: 2(p-1)/p of N x (12 + 6 forward, 12 backward) x 8 bytes
        assert want.tolist() == [2 * (p - 1) * len(X) * 30 * 8 // p] * p


@pytest.mark.parametrize("name,m", [("gpipe", 1), ("gpipe", 4), ("1f1b", 4), ("zb_h1", 4)])
@pytest.mark.parametrize("p", [2, 4])
def test_pipeline_sends_only_the_boundary_activations(name, m, p):
    sizes = [6, 12, 10, 12, 4]
    mlp = MLP(sizes, dtype=np.float64, seed=1)
    X, y = batch(n=8)

    def step(comm):
        execute(comm, schedule(name, p, m), mlp, X, y)

    payload, fp = payload_and_checks(run_local(traced, p, step))
    np.testing.assert_array_equal(payload, traffic.pipeline_bytes(sizes, len(X), p))
    assert not fp.any()  # point-to-point only
    if p == 2:  # one boundary (width 10): N x 10 x 8 bytes forward from rank 0, back from rank 1
        assert traffic.pipeline_bytes(sizes, 8, 2).tolist() == [8 * 10 * 8] * 2


def test_layer_split_is_a_one_micro_batch_pipeline():
    sizes = [6, 12, 12, 4]
    mlp = MLP(sizes, dtype=np.float64, seed=1)
    X, y = batch()
    payload, _ = payload_and_checks(run_local(traced, 3, layer_split, mlp, X, y))
    np.testing.assert_array_equal(payload, traffic.pipeline_bytes(sizes, len(X), 3))
    assert payload.tolist() == [7 * 12 * 8, 2 * 7 * 12 * 8, 7 * 12 * 8]


def test_interleaved_pipeline_counts_every_boundary():
    sizes = [6, 12, 12, 12, 4]
    mlp = MLP(sizes, dtype=np.float64, seed=1)
    X, y = batch(n=8)

    def step(comm):
        execute(comm, schedule("interleaved_1f1b", 2, 2, chunks=2), mlp, X, y)

    payload, _ = payload_and_checks(run_local(traced, 2, step))
    np.testing.assert_array_equal(payload, traffic.pipeline_bytes(sizes, 8, 2, chunks=2))


@pytest.mark.parametrize("p", [2, 3, 4])
def test_data_parallel_sends_the_gradient_whatever_the_batch(p):
    from coursekit.collectives import allreduce

    n = 1001

    def step(comm):
        allreduce(comm, np.ones(n))

    payload, fp = payload_and_checks(run_local(traced, p, step))
    np.testing.assert_array_equal(payload, traffic.data_parallel_bytes(n, p))
    assert abs(payload.max() - 2 * (p - 1) / p * n * 8) <= 2 * 8 * (p - 1)  # array_split's extra row
    np.testing.assert_array_equal(fp, traffic.fingerprint_bytes(1, p))


def test_bad_arguments_are_named():
    with pytest.raises(ValueError, match="cannot split"):
        traffic.pipeline_bytes([6, 12, 4], 8, 3)
    with pytest.raises(ValueError, match="two widths"):
        traffic.tensor_parallel_bytes([6], 8, 2)
    with pytest.raises(ValueError):
        traffic.data_parallel_bytes(0, 2)
