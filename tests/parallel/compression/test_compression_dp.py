"""Chapter 6's compressors plugged into chapter 3's synchronous data-parallel training."""

from dataclasses import replace

import numpy as np
import pytest

from coursekit.parallel.compression.experiment import GradientSum, CompressionConfig, dp_config
from coursekit.parallel.compression.experiment import train as train_compressed
from coursekit.parallel.data_parallel import DPConfig, train
from coursekit.cluster.runner import LocalRunner, RankFailure

THREADS = LocalRunner(3)


@pytest.fixture(scope="module")
def digits(digits_f64):
    return digits_f64.X_train[:240], digits_f64.y_train[:240]


CFG = DPConfig(sizes=(64, 16, 10), dtype="float64", batch_size=24, epochs=2, lr=0.1, seed=3,
               publish_interval=0.0)


@pytest.mark.parametrize("n", [2, 3])
def test_the_identity_compressor_gives_plain_allreduce_training(digits, n):
    plain = train(THREADS, CFG, digits, workers=n)
    hooked = train(THREADS, CFG, digits, workers=n,
                   gradient_sum=GradientSum(CompressionConfig("none")))
    np.testing.assert_allclose(hooked.params, plain.params, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(hooked.loss, plain.loss, rtol=1e-10)


def test_topk_with_error_feedback_trains_through_the_hook(digits):
    plain = train(THREADS, CFG, digits, workers=2)
    topk = train(THREADS, CFG, digits, workers=2, gradient_sum=GradientSum(
        CompressionConfig("topk", 0.05, error_feedback=True)))
    assert not np.allclose(topk.params, plain.params)  # the hook really changed the exchange
    for result in (plain, topk):
        assert np.nanmean(result.loss[-5:]) < 0.7 * np.nanmean(result.loss[:5])


@pytest.mark.parametrize("change", [dict(bucket_bytes=8192), dict(exchange="ps")])
def test_the_hook_needs_whole_gradient_allreduce(digits, change):
    with pytest.raises(ValueError, match="gradient_sum replaces the allreduce of whole gradients"):
        train(THREADS, replace(CFG, **change), digits, workers=2,
              gradient_sum=GradientSum(CompressionConfig("none")))


def test_the_chapter_experiment_is_chapter_3s_training_with_the_hook(digits_f64):
    """compression.experiment.train = data_parallel.train + GradientSum, read per epoch."""
    setup = CompressionConfig("none", epochs=2, batch_size=8, hidden=16, seed=5)
    runner = LocalRunner(3)
    result = train_compressed(runner, setup, digits_f64)
    config = dp_config(setup, digits_f64, 3)
    plain = train(runner, config, (digits_f64.X_train, digits_f64.y_train),
                  (digits_f64.X_test, digits_f64.y_test))
    assert config.batch_size == 24 and result.steps_per_epoch == -(-len(digits_f64.X_train) // 24)
    np.testing.assert_allclose(result.params[0], plain.params, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(result.test_accuracy, plain.test_accuracy, atol=1 / 450)
    per_step = 4 * result.n_params  # the identity sends the float32 gradient
    assert list(result.payload_bytes) == [per_step * result.steps_per_epoch * e for e in (1, 2)]
    assert np.all(np.diff(result.seconds) > 0) and np.all(result.exchange_seconds < result.seconds)


def test_a_diverging_run_names_the_epoch_and_the_setting(digits):
    setup = CompressionConfig("none", lr=1e30, hidden=16)
    hook = GradientSum(setup, steps_per_epoch=4)
    with pytest.raises(RankFailure, match=r"Diverged: diverged at epoch \d+, step \d+ with none: "
                                          r"lower the learning rate \(lr=1e\+30\)"):
        train(THREADS, replace(CFG, lr=1e30), digits, workers=2, gradient_sum=hook)
