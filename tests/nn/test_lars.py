"""LARS on the flat buffer: the update rule by hand, the trust ratio, large-batch training."""

import numpy as np
import pytest

from coursekit.data import load_digits
from coursekit.nn import MLP, train
from coursekit.nn.lars import LARS, mlp_segments


def test_one_step_by_hand():
    w = np.array([3.0, 4.0, 1.0, 0.5], dtype=np.float64)  # segment 0: ||w|| = 5
    g = np.array([0.6, 0.8, 2.0, -1.0])                    # segment 0: ||g|| = 1
    opt = LARS(w, lr=0.5, momentum=0.9, weight_decay=0.1, trust=0.02,
               segments=[(0, 2, True), (2, 4, False)])
    opt.step(g)
    ratio = 0.02 * 5 / (1 + 0.1 * 5)
    expected0 = np.array([3.0, 4.0]) - 0.5 * ratio * (np.array([0.6, 0.8]) + 0.1 * np.array([3.0, 4.0]))
    expected1 = np.array([1.0, 0.5]) - 0.5 * np.array([2.0, -1.0])  # not adapted, no decay
    np.testing.assert_allclose(w, np.concatenate([expected0, expected1]))
    np.testing.assert_allclose(opt.last_ratios, [ratio, 1.0])
    w_before = w.copy()
    opt.step(g)  # the unadapted segment: v2 = 0.9 v1 + lr g with v1 = lr g
    np.testing.assert_allclose(w[2:], w_before[2:] - (0.9 * 0.5 + 0.5) * g[2:])


def test_update_size_is_independent_of_gradient_scale():
    """The point of LARS: a layer's step is lr * trust * ||w||, whatever ||g|| is."""
    steps = []
    for scale in (1e-4, 1.0, 1e4):
        w = np.ones(100)
        opt = LARS(w, lr=1.0, momentum=0.0, trust=0.01)
        opt.step(np.full(100, scale))
        steps.append(np.linalg.norm(1.0 - w))
    np.testing.assert_allclose(steps, 0.01 * np.linalg.norm(np.ones(100)))


def test_zero_norms_fall_back_to_ratio_one():
    w = np.zeros(4)
    opt = LARS(w, lr=0.1, momentum=0.0)
    opt.step(np.ones(4))
    np.testing.assert_allclose(w, -0.1)


def test_zero_gradient_with_weight_decay_keeps_ratio_one():
    """torchlars / apex LARC: ratio 1 when ||g|| = 0, not trust / weight_decay."""
    w = np.array([3.0, 4.0, 1.0, 2.0])
    g = np.array([0.0, 0.0, 0.6, 0.8])
    opt = LARS(w.copy(), lr=0.1, momentum=0.0, weight_decay=0.1, trust=0.02,
               segments=[(0, 2, True), (2, 4, True)])
    ratio = 0.02 * np.sqrt(5.0) / (1 + 0.1 * np.sqrt(5.0))
    np.testing.assert_allclose(opt.trust_ratios(g), [1.0, ratio])


def test_mlp_segments_tile_the_buffer():
    segs = mlp_segments([64, 32, 10])
    assert segs == [(0, 2048, True), (2048, 2080, False), (2080, 2400, True),
                    (2400, 2410, False)]


@pytest.mark.parametrize("kwargs, match", [
    (dict(lr=0.0), "lr"), (dict(momentum=1.0), "momentum"), (dict(trust=-1.0), "trust"),
    (dict(weight_decay=-0.1), "weight_decay"),
    (dict(segments=[(0, 5, True)]), "tile"), (dict(segments=[(0, 4, True), (5, 10, True)]), "tile"),
    (dict(segments=[]), "tile"),
])
def test_bad_arguments(kwargs, match):
    with pytest.raises(ValueError, match=match):
        LARS(np.zeros(10), **kwargs)


def test_bad_grad_shape():
    opt = LARS(np.zeros(10))
    with pytest.raises(ValueError, match="grad must match"):
        opt.step(np.zeros(9))


def test_large_batch_digits_lars_survives_where_momentum_diverges():
    """Batch 1024 with the linearly scaled rate 0.1 x 1024/32 = 3.2: momentum SGD blows up,
    LARS (same rate, per-layer trust ratio) trains."""
    d = load_digits()
    results = {}
    for name in ("momentum", "lars"):
        m = MLP([64, 128, 10], seed=0)
        opt = (LARS(m.params, lr=3.2, momentum=0.9, trust=0.01, segments=mlp_segments(m.sizes))
               if name == "lars" else None)
        h = train(m, d.X_train, d.y_train, epochs=15, batch_size=1024, lr=3.2, momentum=0.9,
                  optimizer=opt, X_test=d.X_test, y_test=d.y_test, seed=0)
        results[name] = h.test_accuracy[-1]
    assert results["lars"] > 0.85
    assert results["momentum"] < results["lars"] - 0.2
