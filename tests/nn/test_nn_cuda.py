"""CUDA device selection here; the kernels themselves run in numba's simulator, in a subprocess
(``tests/nn/test_nn_cuda_sim.py``, through :func:`cudasim.run_in_simulator`).
"""

from pathlib import Path

import pytest
from cudasim import run_in_simulator

from coursekit.nn import MLP
from coursekit.nn.mlp import resolve_device

SIM_TESTS = Path(__file__).with_name("test_nn_cuda_sim.py")


@pytest.mark.slow  # a second pytest process; the simulator runs every GPU thread in Python
def test_cuda_kernels_match_cpu_in_the_simulator():
    run_in_simulator(SIM_TESTS)


def test_device_selection_without_a_gpu():
    from numba import cuda

    if cuda.is_available():
        pytest.skip("this machine has a GPU")
    assert resolve_device("auto") == "cpu"
    assert MLP([3, 2], device="auto").device == "cpu"
    with pytest.raises(ValueError, match="device='cuda' but numba finds no usable CUDA GPU"):
        MLP([3, 2], device="cuda")


def test_mixed_precision_device_without_a_gpu():
    from numba import cuda

    from coursekit.nn.mixed_precision import MixedPrecision

    if cuda.is_available():
        pytest.skip("this machine has a GPU")
    model = MLP([3, 2])
    assert MixedPrecision(model, "fp16", device="auto").device == "cpu"
    assert MixedPrecision(model, "fp16").device == "cpu"  # the emulation stays the default
    with pytest.raises(ValueError, match="device='cuda' but numba finds no usable CUDA GPU"):
        MixedPrecision(model, "fp16", device="cuda")
    with pytest.raises(ValueError, match="fmt='bf16' cannot run on device='cuda'"):
        MixedPrecision(model, "bf16", device="cuda")
