"""Learning-rate rules: the formulas of the lecture, and clear errors."""

import math

import pytest

from coursekit.parallel.data_parallel.lr_rules import RULES, LRSchedule, scaled_lr


@pytest.mark.parametrize("n", [1, 2, 4, 9])
def test_rules_scale_the_rate_as_the_lecture_says(n):
    assert scaled_lr(0.1, "constant", n) == pytest.approx(0.1)
    assert scaled_lr(0.1, "linear", n) == pytest.approx(0.1 * n)
    assert scaled_lr(0.1, "sqrt", n) == pytest.approx(0.1 * math.sqrt(n))


def test_gradual_warmup_ramps_linearly_from_the_small_batch_rate():
    s = LRSchedule(0.1, "linear_warmup", 8, warmup_steps=4)
    assert [s(t) for t in range(6)] == pytest.approx([0.1, 0.275, 0.45, 0.625, 0.8, 0.8])
    assert s.peak == pytest.approx(0.8)
    # no ramp: the linear rule from the first step
    assert LRSchedule(0.1, "linear_warmup", 8)(0) == pytest.approx(0.8)


def test_one_worker_is_the_serial_rate_for_every_rule():
    for rule in RULES:
        assert [LRSchedule(0.05, rule, 1, 3)(t) for t in range(5)] == pytest.approx([0.05] * 5)


@pytest.mark.parametrize("kwargs, message", [
    (dict(rule="cubic"), r"unknown learning-rate rule 'cubic'; allowed: constant, linear, sqrt, linear_warmup"),
    (dict(base_lr=0.0), r"base_lr=0.0: must be > 0"),
    (dict(n=0), r"n \(the batch scale\)=0: must be > 0"),
    (dict(warmup_steps=-1), r"warmup_steps=-1: must be >= 0"),
])
def test_bad_settings_are_rejected_clearly(kwargs, message):
    args = dict(base_lr=0.1, rule="linear", n=4, warmup_steps=0) | kwargs
    with pytest.raises(ValueError, match=message):
        LRSchedule(**args)


def test_negative_step_is_rejected():
    with pytest.raises(ValueError, match="step=-1: must be >= 0"):
        LRSchedule(0.1, "linear", 2)(-1)
