"""Batch inference on p ranks: predictions equal the serial ones, bytes equal B(p)."""

import numpy as np
import pytest

from coursekit.cluster.runner import ClusterRunner, LocalRunner
from coursekit.comm import setup_comm
from coursekit.nn import MLP
from coursekit.parallel.inference import BatchInferenceConfig, batch_bytes, batch_inference


@pytest.fixture(scope="module")
def model_and_data():
    rng = np.random.default_rng(0)
    return MLP([16, 12, 5], seed=0), rng.standard_normal((50, 16)).astype(np.float32)


def _check(runner, mlp, X, p, rows=120):
    r = batch_inference(runner, BatchInferenceConfig(rows=rows, repeats=2), mlp, X, workers=p)
    serial = mlp.predict(X[np.arange(rows) % len(X)])
    np.testing.assert_array_equal(r.predictions, serial)
    # the rows scattered (4 bytes x 16 features) plus the labels gathered (8 bytes), (p-1)/p
    assert r.bytes_sent == batch_bytes(rows, 16, p) == (p - 1) * rows // p * (4 * 16 + 8)
    assert r.p == p and r.seconds.shape == r.compute_seconds.shape == (2,)
    assert r.throughput == rows / r.seconds.min()


@pytest.mark.parametrize("p", [1, 2, 3, 4])
def test_threads(model_and_data, p):
    _check(LocalRunner(4), *model_and_data, p)


@pytest.mark.cluster
@pytest.mark.parametrize("p", [1, 2, 4])
def test_engines(cluster4, model_and_data, p):
    setup_comm(cluster4)
    _check(ClusterRunner(cluster4, timeout=60), *model_and_data, p)


def test_bad_input_is_refused(model_and_data):
    mlp, X = model_and_data
    with pytest.raises(ValueError, match="divisible by workers=4"):
        batch_inference(LocalRunner(4), BatchInferenceConfig(rows=30), mlp, X, workers=4)
    with pytest.raises(ValueError, match="16 columns"):
        batch_inference(LocalRunner(2), BatchInferenceConfig(rows=30), mlp, X[:, :3])
    with pytest.raises(ValueError, match="rows=0"):
        BatchInferenceConfig(rows=0)
    with pytest.raises(TypeError, match="repeats"):
        BatchInferenceConfig(repeats=2.0)
    with pytest.raises(ValueError, match="divisible by p=4"):
        batch_bytes(30, 16, 4)
