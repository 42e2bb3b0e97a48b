"""Data parallel (chapter 3) and compression (chapter 6) with device="cuda" == "cpu", in
numba's CUDA simulator (run by test_data_parallel_device.py in its own process), or on a
real GPU where numba finds one (then in the main run too).

Two ThreadComm ranks share the simulator, which runs one kernel at a time: kernels_cuda
makes their launches take turns there (so a simulated rank's "stage" time includes waiting
for the other's kernels). Sizes are tiny: the simulator runs every GPU thread as a Python
thread (~0.3 s a step here).
"""

from dataclasses import replace

import numpy as np
import pytest

from cudasim import gpu_or_simulator

if not gpu_or_simulator():
    pytest.skip("needs a GPU, or its own process with NUMBA_ENABLE_CUDASIM=1 "
                "(see test_data_parallel_device.py)", allow_module_level=True)

from coursekit.cluster.runner import LocalRunner  # noqa: E402
from coursekit.data import Dataset  # noqa: E402
from coursekit.parallel.compression.experiment import CompressionConfig  # noqa: E402
from coursekit.parallel.compression.experiment import train as train_compressed  # noqa: E402
from coursekit.parallel.data_parallel import DPConfig, train  # noqa: E402

RANKS = LocalRunner(2)
_rng = np.random.default_rng(0)
X, Y = _rng.standard_normal((16, 4)), _rng.integers(0, 3, 16)
STEPS = 3
# float64: the GPU sums in another order than BLAS, a few ulps per step; float32: ~1e-7
# relative per operation, a few steps of SGD
TOLERANCE = {"float64": dict(rtol=1e-12, atol=1e-14), "float32": dict(rtol=1e-5, atol=1e-6)}


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_sync_data_parallel_on_the_gpu_gives_the_cpu_parameters_and_stage_spans(dtype):
    cfg = DPConfig(sizes=(4, 5, 3), dtype=dtype, batch_size=4, epochs=1, max_steps=STEPS,
                   lr=0.5, momentum=0.9, seed=5, timeline_steps=STEPS, publish_interval=0.0)
    cpu = train(RANKS, cfg, (X, Y), (X[:6], Y[:6]))
    gpu = train(RANKS, replace(cfg, device="cuda"), (X, Y), (X[:6], Y[:6]))
    assert cpu.devices == ["cpu", "cpu"] and gpu.devices == ["cuda:0", "cuda:0"]
    assert not np.allclose(gpu.params, _initial(cfg))  # it trained
    np.testing.assert_allclose(gpu.params, cpu.params, **TOLERANCE[dtype])
    np.testing.assert_allclose(gpu.loss, cpu.loss, **TOLERANCE[dtype])
    np.testing.assert_array_equal(gpu.test_accuracy, cpu.test_accuracy)  # forward on the GPU
    for rank in range(2):
        kinds = [s.kind for s in gpu.spans if s.rank == rank]
        assert kinds.count("stage") == 2 * STEPS  # in and out, every step
        assert {"compute", "comm"} <= set(kinds)
    assert not any(s.kind == "stage" for s in cpu.spans) and cpu.stage_s is None
    assert gpu.stage_s.shape == (2, STEPS) and (gpu.stage_s > 0).all()
    parts = gpu.step_breakdown()
    assert parts.stage > 0 and min(parts.compute, parts.communication, parts.other) >= 0
    assert parts.step == pytest.approx(parts.compute + parts.stage + parts.communication
                                       + parts.other)


def _initial(cfg):
    from coursekit.nn import MLP

    return MLP(cfg.sizes, cfg.activation, cfg.loss, dtype=cfg.dtype, seed=cfg.seed).params


def test_compressed_training_on_the_gpu_equals_the_cpu():
    data = Dataset("tiny", X[:12], Y[:12], X[12:], Y[12:], 3)
    cfg = CompressionConfig("topk", 0.5, True, epochs=1, batch_size=2, lr=0.5, hidden=5, seed=1)
    cpu = train_compressed(RANKS, cfg, data)
    gpu = train_compressed(RANKS, replace(cfg, device="cuda"), data)
    assert cpu.devices == ["cpu", "cpu"] and gpu.devices == ["cuda:0", "cuda:0"]
    for got, want in zip(gpu.params, cpu.params):
        np.testing.assert_allclose(got, want, **TOLERANCE["float32"])  # chapter 6 is float32
    np.testing.assert_array_equal(gpu.wire_bytes, cpu.wire_bytes)
    np.testing.assert_array_equal(gpu.test_accuracy, cpu.test_accuracy)
