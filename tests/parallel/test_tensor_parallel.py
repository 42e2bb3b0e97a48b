"""Megatron column/row-parallel layers and the naive layer split equal the serial MLP."""

import numpy as np
import pytest

from coursekit.comm import run_local
from coursekit.nn import MLP
from coursekit.parallel.tensor_parallel import TensorParallelMLP, layer_split


def batch(n=11, n_in=6, n_classes=4, seed=0):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((n, n_in)), rng.integers(0, n_classes, n)


def tp_step(comm, mlp, X, y):
    tp = TensorParallelMLP(comm, mlp)
    loss, shards = tp.loss_and_grad(X, y)
    return loss, tp.forward(X)[1], tp.full_grad(shards), shards


# 2 and 4 layers end row-parallel (replicated output); 3 end column-parallel (allgather)
@pytest.mark.parametrize("sizes", [[6, 12, 4], [6, 12, 12, 6], [6, 12, 6, 12, 4]])
@pytest.mark.parametrize("p", [2, 3])
@pytest.mark.parametrize("activation,loss", [("relu", "softmax_xent"), ("tanh", "mse")])
def test_tensor_parallel_equals_serial(sizes, p, activation, loss):
    mlp = MLP(sizes, activation, loss, dtype=np.float64, seed=2)
    X, y = batch()
    want_loss, want = mlp.loss_and_grad(X, y)
    for got_loss, out, grad, _ in run_local(tp_step, p, mlp, X, y):
        assert got_loss == pytest.approx(want_loss, rel=1e-12)
        np.testing.assert_allclose(out, mlp.forward(X), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(grad, want, rtol=1e-10, atol=1e-13)


def test_each_rank_holds_a_column_then_a_row_shard():
    mlp = MLP([6, 12, 4], dtype=np.float64, seed=2)  # layer 0 column-, layer 1 row-parallel
    X, y = batch()
    _, want = mlp.loss_and_grad(X, y)
    serial = [(W.copy(), b.copy()) for W, b in
              ((want[l.span][:l.W.size].reshape(l.W.shape), want[l.span][l.W.size:]) for l in mlp.layers)]
    for r, (*_, shards) in enumerate(run_local(tp_step, 2, mlp, X, y)):
        (dW0, db0), (dW1, db1) = shards
        np.testing.assert_allclose(dW0, serial[0][0][:, 6 * r:6 * (r + 1)], atol=1e-13)
        np.testing.assert_allclose(db0, serial[0][1][6 * r:6 * (r + 1)], atol=1e-13)
        np.testing.assert_allclose(dW1, serial[1][0][6 * r:6 * (r + 1)], atol=1e-13)
        np.testing.assert_allclose(db1, serial[1][1], atol=1e-13)  # replicated


def test_widths_that_do_not_split_give_a_clear_error():
    mlp = MLP([6, 10, 4], dtype=np.float64, seed=0)
    with pytest.raises(ValueError, match=r"layer 0 is column-parallel: its n_out=10 cannot be split "
                                         r"evenly over 3 ranks; allowed rank counts: \[1, 2, 5, 10\]"):
        run_local(lambda comm: TensorParallelMLP(comm, mlp), 3)


@pytest.mark.parametrize("p", [1, 2, 4])
def test_layer_split_equals_serial(p):
    mlp = MLP([6, 8, 8, 8, 4], dtype=np.float64, seed=1)
    X, y = batch()
    want_loss, want = mlp.loss_and_grad(X, y)
    parts = run_local(layer_split, p, mlp, X, y)
    assert sum(r.loss for r in parts) == pytest.approx(want_loss, rel=1e-12)
    np.testing.assert_allclose(sum(r.grad for r in parts), want, rtol=1e-10, atol=1e-13)
