"""Optimizers, the training loop and the default digits settings (chapter 1)."""

import numpy as np
import pytest

from coursekit.data import load_digits, make_classification
from coursekit.nn import MLP, SGD, Momentum, train
from coursekit.nn.experiment import train_digits


def test_sgd_step_is_w_minus_lr_g():
    rng = np.random.default_rng(0)
    w = rng.standard_normal(10).astype(np.float32)
    g = rng.standard_normal(10).astype(np.float32)
    want = w - np.float32(0.3) * g
    SGD(w, lr=0.3).step(g)
    np.testing.assert_allclose(w, want, rtol=1e-6)


def test_momentum_matches_the_recurrence():
    rng = np.random.default_rng(1)
    w = rng.standard_normal(6)
    opt = Momentum(w, lr=0.1, momentum=0.9)
    w_ref, v_ref = w.copy(), np.zeros(6)
    for _ in range(4):
        g = rng.standard_normal(6)
        v_ref = 0.9 * v_ref + g
        w_ref = w_ref - 0.1 * v_ref
        opt.step(g)
    np.testing.assert_allclose(w, w_ref, rtol=1e-12)
    np.testing.assert_allclose(opt.velocity, v_ref, rtol=1e-12)


@pytest.mark.parametrize(
    "make, error, match",
    [
        (lambda w: SGD(w, lr=0), ValueError, "lr=0: must be > 0"),
        (lambda w: SGD(w, lr=float("nan")), ValueError, "lr=nan"),
        (lambda w: SGD(w, lr="0.1"), TypeError, "lr must be a real number"),
        (lambda w: Momentum(w, momentum=1.0), ValueError, r"momentum=1.0: must be in \[0, 1\)"),
        (lambda w: SGD(w.reshape(2, 2)), TypeError, "flat, contiguous 1-D"),
        (lambda w: SGD(w).step(np.zeros(3)), ValueError, "grad must match params"),
    ],
)
def test_optimizer_arguments_are_checked(make, error, match):
    with pytest.raises(error, match=match):
        make(np.zeros(4))


def test_train_is_deterministic_and_equals_a_hand_written_loop():
    data = make_classification(n_samples=120, n_features=8, n_classes=3, seed=2)
    runs = []
    for _ in range(2):
        mlp = MLP([8, 10, 3], seed=5, dtype=np.float64)
        h = train(mlp, data.X_train, data.y_train, epochs=3, batch_size=16, lr=0.05, seed=11)
        runs.append((mlp.params.copy(), h))
    np.testing.assert_array_equal(runs[0][0], runs[1][0])
    np.testing.assert_array_equal(runs[0][1].step_loss, runs[1][1].step_loss)

    # the same run by hand: per-epoch permutation from the same Generator, then slices
    mlp = MLP([8, 10, 3], seed=5, dtype=np.float64)
    rng = np.random.default_rng(11)
    losses = []
    for _ in range(3):
        order = rng.permutation(len(data.X_train))
        X, y = data.X_train[order], data.y_train[order]
        for s in range(0, len(X), 16):
            loss, g = mlp.loss_and_grad(X[s : s + 16], y[s : s + 16])
            mlp.params[...] -= 0.05 * g
            losses.append(loss)
    np.testing.assert_allclose(mlp.params, runs[0][0], rtol=1e-12)
    np.testing.assert_allclose(losses, runs[0][1].step_loss, rtol=1e-12)
    h = runs[0][1]
    assert h.epochs == 3 and len(h.step_loss) == 3 * int(np.ceil(len(data.X_train) / 16))
    assert np.all(np.isnan(h.test_accuracy))


def test_history_curves_are_what_they_say():
    data = make_classification(n_samples=100, n_features=5, n_classes=2, seed=3)
    mlp = MLP([5, 4, 2], seed=0)
    seen = []
    h = train(mlp, data.X_train, data.y_train, epochs=2, batch_size=100, X_test=data.X_test,
              y_test=data.y_test, callback=seen.append)
    assert [s.epochs for s in seen] == [1, 2]
    np.testing.assert_allclose(h.train_loss, h.step_loss)  # one batch per epoch
    assert h.train_accuracy[-1] == mlp.accuracy(data.X_train, data.y_train)
    assert h.test_accuracy[-1] == mlp.accuracy(data.X_test, data.y_test)


def test_train_rejects_bad_arguments():
    mlp = MLP([3, 2])
    X, y = np.zeros((4, 3)), np.array([0, 1, 0, 1])
    with pytest.raises(ValueError, match="epochs=0: must be >= 1"):
        train(mlp, X, y, epochs=0)
    with pytest.raises(ValueError, match="both X_test and y_test"):
        train(mlp, X, y, X_test=X)
    with pytest.raises(ValueError, match=r"y \(labels\) must lie in \[0, 2\)"):
        train(mlp, X, np.array([0, 1, 2, 0]))


def test_default_digits_settings_reach_95_percent():
    result = train_digits()
    assert result.test_accuracy >= 0.95, result.history.test_accuracy
    assert result.history.train_loss[-1] < result.history.train_loss[0]


def test_momentum_trains_digits_too():
    data = load_digits()
    mlp = MLP([64, 32, 10], seed=0)
    h = train(mlp, data.X_train, data.y_train, epochs=5, lr=0.02, momentum=0.9, X_test=data.X_test,
              y_test=data.y_test)
    assert h.test_accuracy[-1] >= 0.9


def test_scheduled_optimizer_follows_goyal_warmup():
    import numpy as np
    import pytest

    from coursekit.nn.optim import SGD, Scheduled
    from coursekit.parallel.data_parallel.lr_rules import LRSchedule

    params = np.zeros(3)
    opt = Scheduled(SGD(params, 0.1), LRSchedule(0.1, "linear_warmup", 32, warmup_steps=4))
    rates = []
    for _ in range(6):
        opt.step(np.ones(3))
        rates.append(opt.lr)
    assert rates == pytest.approx([0.1, 0.1 + 3.1 / 4, 0.1 + 6.2 / 4, 0.1 + 9.3 / 4, 3.2, 3.2])
    assert params == pytest.approx(-sum(rates) * np.ones(3))
    with pytest.raises(TypeError, match="schedule"):
        Scheduled(SGD(params, 0.1), 3.2)
