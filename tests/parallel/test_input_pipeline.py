"""The input-pipeline experiment: each rank reads chapter 3's batches in the sampler's order
with and without prefetching, and the step times keep the bounds no scheduler can break."""

import numpy as np
import pytest

from coursekit.cluster.runner import LocalRunner
from coursekit.parallel.data_parallel.sampler import Sampler
from coursekit.parallel.input_pipeline import PipelineConfig, measure_input_pipeline


@pytest.fixture(scope="module")
def result(digits_f32):
    config = PipelineConfig(read_s=0.02, compute_s=0.01, readers=2, depth=3, batch=16, steps=5,
                            seed=3)
    return measure_input_pipeline(LocalRunner(3), config, (digits_f32.X_train, digits_f32.y_train))


def test_both_loops_get_the_sampler_batches_in_order(result, digits_f32):
    cfg, p = result.config, 3
    sampler = Sampler(len(digits_f32.X_train), cfg.batch * p, cfg.seed)
    for step in range(cfg.steps):  # the ranks' batches side by side are chapter 3's global batch
        assert np.array_equal(np.concatenate(result.planned[:, step]), sampler.batch(step))
    assert np.array_equal(result.serial_rows, result.planned)
    assert np.array_equal(result.overlapped_rows, result.planned)
    assert len(np.unique(result.planned)) == result.planned.size == p * cfg.steps * cfg.batch


def test_step_times_keep_the_bounds_sleep_and_the_compute_loop_guarantee(result):
    cfg = result.config
    assert result.serial_steps.shape == result.overlapped_steps.shape == (3, cfg.steps)
    # a sleep never returns early and the compute runs until compute_s has passed
    assert (result.read_s >= cfg.read_s).all() and (result.compute_s >= cfg.compute_s).all()
    assert (result.serial_steps >= cfg.read_s + cfg.compute_s).all()
    assert (result.overlapped_steps >= cfg.compute_s).all()
    np.testing.assert_allclose(result.serial_model, result.read_s + result.compute_s)
    np.testing.assert_allclose(result.overlapped_model,
                               np.maximum(result.read_s / 2, result.compute_s))


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(read_s=-0.1), ValueError, r"read_s=-0.1: must be in \[0, 1\]"),
    (dict(compute_s="fast"), TypeError, "compute_s must be a real number"),
    (dict(readers=0), ValueError, r"readers=0: must be in \[1, 16\]"),
    (dict(readers=4, depth=2), ValueError, r"depth=2 is less than readers=4"),
    (dict(steps=1), ValueError, r"steps=1: must be in \[2, 1000\]"),
    (dict(batch=0), ValueError, r"batch=0: must be >= 1"),
])
def test_config_refuses_bad_values(kwargs, error, match):
    with pytest.raises(error, match=match):
        PipelineConfig(**kwargs)


def test_experiment_refuses_more_rows_than_an_epoch_and_wrong_arguments(digits_f32):
    data = (digits_f32.X_train, digits_f32.y_train)
    with pytest.raises(ValueError, match=r"steps=100 x batch=32 x 2 ranks = 6400 rows > the 1347 rows"):
        measure_input_pipeline(LocalRunner(2), PipelineConfig(steps=100), data)
    with pytest.raises(TypeError, match="runner must be a Runner"):
        measure_input_pipeline("engines", PipelineConfig(), data)
    with pytest.raises(TypeError, match="config must be a PipelineConfig"):
        measure_input_pipeline(LocalRunner(2), {"read_s": 0.01}, data)
    with pytest.raises(ValueError, match="workers=3 but"):
        measure_input_pipeline(LocalRunner(2), PipelineConfig(), data, workers=3)
