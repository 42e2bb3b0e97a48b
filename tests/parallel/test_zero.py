"""ZeRO stages 0-3 on ThreadComm ranks: the serial step, the memory table, the bytes sent."""

import numpy as np
import pytest

from coursekit.comm import run_local
from coursekit.data import load_digits
from coursekit.nn import MLP
from coursekit.nn.optim import make_optimizer
from coursekit.parallel.zero import ShardLayout, sent_bytes, state_bytes, train_zero

DIGITS = load_digits()
X, Y = DIGITS.X_train[:240], DIGITS.y_train[:240]
SIZES = (64, 23, 17, 10)  # layer blocks of 1495, 408, 180 values: none divides by 3 or 4


def serial(steps, batch_size, lr, momentum, seed=0):
    """The reference: plain training on the same global batches."""
    mlp = MLP(SIZES, dtype=np.float64, seed=1)
    opt = make_optimizer(mlp.params, lr, momentum)
    order = np.random.default_rng(seed).permutation(len(X))
    per_epoch = len(X) // batch_size
    for t in range(steps):
        rows = order[(t % per_epoch) * batch_size:(t % per_epoch + 1) * batch_size]
        _, grad = mlp.loss_and_grad(X[rows], Y[rows])
        opt.step(grad)
    return mlp.params.copy()


def zero(n, stage, steps, batch_size, lr, momentum):
    def rank(comm):
        return train_zero(comm, MLP(SIZES, dtype=np.float64, seed=1), X, Y, stage=stage,
                          steps=steps, batch_size=batch_size, lr=lr, momentum=momentum)
    return run_local(rank, n)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("n", [1, 3, 4])
@pytest.mark.parametrize("momentum", [0.0, 0.9])
def test_every_stage_takes_the_serial_step(stage, n, momentum):
    for steps in (1, 7):
        want = serial(steps, 48, 0.1, momentum)
        for result in zero(n, stage, steps, 48, 0.1, momentum):
            np.testing.assert_allclose(result.params, want, rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("stage", [0, 1, 2, 3])
@pytest.mark.parametrize("n", [2, 3, 4])
def test_each_rank_holds_what_the_table_says_and_sends_what_the_formula_says(stage, n):
    mlp = MLP(SIZES, dtype=np.float64, seed=1)
    layout = ShardLayout.of(mlp, n)
    steps = 3
    results = zero(n, stage, steps, 48, 0.1, 0.9)
    want = state_bytes(stage, mlp.n_params, layout, 8, state_buffers=1)
    assert [r.memory for r in results] == [want] * n
    assert sum(r.sent for r in results) == steps * sent_bytes(stage, mlp.n_params, layout, 8)


def test_sharded_parts_shrink_as_one_over_n_and_stage_3_sends_one_and_a_half_allreduces():
    mlp = MLP(SIZES, dtype=np.float64, seed=1)
    for n in (2, 4, 8):
        layout = ShardLayout.of(mlp, n)
        whole = state_bytes(0, mlp.n_params, layout, 8, 1)
        three = state_bytes(3, mlp.n_params, layout, 8, 1)
        padded = n * layout.width
        assert three["params"] * n == padded * 8 and padded - mlp.n_params < n * len(SIZES)
        assert three["optimizer"] == three["params"] and whole["optimizer"] == whole["params"]
        assert sent_bytes(3, mlp.n_params, layout, 8) == 1.5 * sent_bytes(1, mlp.n_params, layout, 8)
        assert sent_bytes(2, mlp.n_params, layout, 8) == sent_bytes(1, mlp.n_params, layout, 8)


def test_a_layout_round_trips_the_flat_buffer():
    mlp = MLP(SIZES, dtype=np.float64, seed=4)
    layout = ShardLayout.of(mlp, 3)
    rows = layout.rows(mlp.params)
    assert rows.shape == (3, layout.width)
    back = np.zeros_like(mlp.params)
    layout.flat_into(rows, back)
    np.testing.assert_array_equal(back, mlp.params)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(stage=4), ValueError, r"stage=4 is not a ZeRO stage; allowed: \(0, 1, 2, 3\)"),
    (dict(batch_size=1), ValueError, "batch_size"),
    (dict(steps=0), ValueError, "steps"),
    (dict(batch_size=10_000), ValueError, "larger than the data"),
])
def test_bad_settings_are_refused(kwargs, error, match):
    settings = dict(stage=1, steps=2, batch_size=48, lr=0.1) | kwargs
    with pytest.raises(error, match=match):
        run_local(lambda comm: train_zero(comm, MLP(SIZES, dtype=np.float64), X, Y, **settings), 2)


def _untraced(comm):
    comm.tracing = False
    result = train_zero(comm, MLP(SIZES, dtype=np.float64, seed=1), X, Y, stage=2, steps=2,
                        batch_size=48, lr=0.1)
    return result.sent, comm.tracing, len(comm.trace)


def test_bytes_are_counted_on_a_comm_that_does_not_trace_and_it_keeps_no_trace():
    layout = ShardLayout.of(MLP(SIZES, dtype=np.float64), 2)
    results = run_local(_untraced, 2)
    assert sum(sent for sent, _, _ in results) == 2 * sent_bytes(2, MLP(SIZES).n_params, layout, 8)
    assert all(tracing is False and kept == 0 for _, tracing, kept in results)
