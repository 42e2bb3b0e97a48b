"""Chapter 6's compressors plugged into chapter 3's synchronous data-parallel training."""

from dataclasses import replace

import numpy as np
import pytest

from coursekit.parallel.compression.experiment import Setup, dp_gradient_sum
from coursekit.parallel.data_parallel import DPConfig, train
from coursekit.runner import LocalRunner

THREADS = LocalRunner(3)


@pytest.fixture(scope="module")
def digits(digits_f64):
    return digits_f64.X_train[:240], digits_f64.y_train[:240]


CFG = DPConfig(sizes=(64, 16, 10), dtype="float64", batch_size=24, epochs=2, lr=0.1, seed=3,
               publish_interval=0.0)


@pytest.mark.parametrize("n", [2, 3])
def test_the_identity_compressor_gives_plain_allreduce_training(digits, n):
    plain = train(THREADS, CFG, digits, workers=n)
    hooked = train(THREADS, CFG, digits, workers=n, gradient_sum=dp_gradient_sum(Setup("none")))
    np.testing.assert_allclose(hooked.params, plain.params, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(hooked.loss, plain.loss, rtol=1e-10)


def test_topk_with_error_feedback_trains_through_the_hook(digits):
    plain = train(THREADS, CFG, digits, workers=2)
    topk = train(THREADS, CFG, digits, workers=2, gradient_sum=dp_gradient_sum(
        Setup("topk", 0.05, error_feedback=True)))
    assert not np.allclose(topk.params, plain.params)  # the hook really changed the exchange
    for result in (plain, topk):
        assert np.nanmean(result.loss[-5:]) < 0.7 * np.nanmean(result.loss[:5])


@pytest.mark.parametrize("change", [dict(bucket_bytes=8192), dict(exchange="ps")])
def test_the_hook_needs_whole_gradient_allreduce(digits, change):
    with pytest.raises(ValueError, match="gradient_sum replaces the allreduce of whole gradients"):
        train(THREADS, replace(CFG, **change), digits, workers=2,
              gradient_sum=dp_gradient_sum(Setup("none")))
