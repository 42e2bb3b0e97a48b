"""Knowledge distillation: the Hinton loss, its gradient (finite differences) and the experiment."""

import numpy as np
import pytest

from coursekit.data import load_digits
from coursekit.nn import MLP
from coursekit.nn.distill import (DistillConfig, distill, distillation_loss,
                                  distillation_loss_and_grad, softmax)
from coursekit.nn.flops import mlp_step_flops


def _logits(seed, n=6, k=5):
    rng = np.random.default_rng(seed)
    return 3 * rng.standard_normal((n, k)), 3 * rng.standard_normal((n, k)), rng.integers(k, size=n)


@pytest.mark.parametrize("T, alpha", [(1.0, 0.5), (4.0, 0.9), (8.0, 1.0), (2.0, 0.0)])
def test_logit_gradient_matches_central_differences(T, alpha):
    zs, zt, y = _logits(0)
    _, grad = distillation_loss(zs, zt, y, T, alpha)
    eps, numeric = 1e-6, np.empty_like(zs)
    for i in np.ndindex(zs.shape):
        plus, minus = zs.copy(), zs.copy()
        plus[i] += eps
        minus[i] -= eps
        numeric[i] = (distillation_loss(plus, zt, y, T, alpha)[0]
                      - distillation_loss(minus, zt, y, T, alpha)[0]) / (2 * eps)
    np.testing.assert_allclose(grad, numeric, rtol=1e-5, atol=1e-9)


def test_loss_is_the_formula():
    zs, zt, y = _logits(1)
    T, alpha = 3.0, 0.7
    qt, qs = softmax(zt, T), softmax(zs, T)
    kl = np.mean(np.sum(qt * np.log(qt / qs), axis=1))
    ce = np.mean(-np.log(softmax(zs)[np.arange(len(y)), y]))
    loss, _ = distillation_loss(zs, zt, y, T, alpha)
    assert loss == pytest.approx(alpha * T * T * kl + (1 - alpha) * ce, rel=1e-12)
    assert distillation_loss(zt, zt, y, T, 1.0)[0] == pytest.approx(0, abs=1e-12)  # KL(q||q) = 0


def test_parameter_gradient_matches_central_differences():
    d = load_digits(dtype=np.float64)
    X, y = d.X_train[:16], d.y_train[:16]
    student = MLP([64, 8, 10], activation="tanh", dtype=np.float64, seed=3)
    zt = MLP([64, 32, 10], dtype=np.float64, seed=4).forward(X)
    _, grad = distillation_loss_and_grad(student, X, y, zt, 4.0, 0.9)
    w, eps = student.params, 1e-6
    for i in np.random.default_rng(0).choice(student.n_params, 40, replace=False):
        saved = w[i]
        w[i] = saved + eps
        plus, _ = distillation_loss_and_grad(student, X, y, zt, 4.0, 0.9)
        w[i] = saved - eps
        minus, _ = distillation_loss_and_grad(student, X, y, zt, 4.0, 0.9)
        w[i] = saved
        assert grad[i] == pytest.approx((plus - minus) / (2 * eps), rel=1e-5, abs=1e-9)


def test_alpha_zero_is_ordinary_training_on_the_hard_labels():
    d = load_digits(dtype=np.float64)
    X, y = d.X_train[:32], d.y_train[:32]
    student = MLP([64, 8, 10], dtype=np.float64, seed=1)
    loss, grad = distillation_loss_and_grad(student, X, y, np.zeros((32, 10)), 4.0, 0.0)
    ref_loss, ref_grad = student.loss_and_grad(X, y)
    assert loss == pytest.approx(ref_loss, rel=1e-10)
    np.testing.assert_allclose(grad, ref_grad, rtol=1e-8, atol=1e-12)


def test_distill_reports_accuracies_of_its_models_and_the_flops_formula():
    d = load_digits()
    r = distill(DistillConfig(teacher=(64, 32, 10), student=(64, 4, 10), epochs=2), d)
    assert r.teacher_accuracy == r.teacher.accuracy(d.X_test, d.y_test)
    assert r.alone_accuracy == r.alone.accuracy(d.X_test, d.y_test)
    assert r.distilled_accuracy == r.distilled.accuracy(d.X_test, d.y_test)
    assert r.teacher_flops == mlp_step_flops((64, 32, 10), 1)["forward"] == 2 * (64 * 32 + 32 * 10)
    assert r.student_flops == mlp_step_flops((64, 4, 10), 1)["forward"]
    assert not np.array_equal(r.alone.params, r.distilled.params)


@pytest.mark.parametrize("kwargs, error, words", [
    ({"T": 0}, ValueError, "T=0"),
    ({"alpha": 0.0}, ValueError, "alpha"),
    ({"alpha": 1.5}, ValueError, "alpha"),
    ({"student": (64, 8, 3)}, ValueError, "output widths"),
    ({"epochs": 1.5}, TypeError, "epochs"),
    ({"lr": -1}, ValueError, "lr"),
])
def test_bad_config_is_refused(kwargs, error, words):
    with pytest.raises(error, match=words):
        DistillConfig(**kwargs)


def test_bad_data_is_refused():
    with pytest.raises(TypeError, match="data must be a Dataset"):
        distill(DistillConfig(), (np.zeros((3, 64)), np.zeros(3, int)))


def test_bad_logits_are_refused():
    with pytest.raises(ValueError, match="same 2-D shape"):
        distillation_loss(np.zeros((2, 3)), np.zeros((2, 4)), np.zeros(2, int), 1.0, 0.5)
