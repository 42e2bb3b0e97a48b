"""The device switch of chapters 4, 5 and 8 (issue 27): checked values, results and panels
that say where each rank computed, tensor parallelism on the layers' kernels, and the
preflight's GPU probe on a machine without a GPU. The CUDA runs themselves are in
``test_model_parallel_cuda_sim.py``, in numba's simulator, in a pytest process of their own."""

import dataclasses
from pathlib import Path

import matplotlib
import numpy as np
import pytest
from cudasim import gpu_or_simulator, run_in_simulator

matplotlib.use("Agg")

from coursekit.cluster.gpu_probe import describe, probe  # noqa: E402
from coursekit.cluster.preflight import engine_facts, gpu_kernel_check  # noqa: E402
from coursekit.cluster.runner import LocalRunner  # noqa: E402
from coursekit.comm import run_local  # noqa: E402
from coursekit.data import Dataset  # noqa: E402
from coursekit.nn import MLP  # noqa: E402
from coursekit.parallel.param_server import PSConfig, train  # noqa: E402
from coursekit.parallel.tensor_parallel import TensorParallelMLP  # noqa: E402
from coursekit.widgets.panel import device_summary  # noqa: E402
from coursekit.widgets.param_server import ParamServerPanel  # noqa: E402

SIM_TESTS = Path(__file__).with_name("test_model_parallel_cuda_sim.py")
RNG = np.random.default_rng(7)
X, Y = RNG.standard_normal((8, 4)), RNG.integers(0, 2, 8)
TINY = Dataset("tiny", X, Y, X[:4], Y[:4], 2)


@pytest.mark.slow  # a second pytest process: the simulator runs every GPU thread in Python
def test_chapters_4_5_8_on_cuda_equal_cpu_in_the_simulator():
    assert "6 passed" in run_in_simulator(SIM_TESTS)


@pytest.mark.parametrize("device", ["gpu", "CUDA", 0, None])
def test_bad_devices_are_refused_by_the_config_and_the_panel(device):
    match = f"device={device!r} is not supported; allowed: cpu, cuda, auto"
    with pytest.raises(ValueError, match=match):
        PSConfig(device=device)
    if device is not None:  # None is the panel's "keep base.device"
        with pytest.raises(ValueError, match=match):
            ParamServerPanel(runner=LocalRunner(2), device=device)


def test_the_device_reaches_the_workers_and_the_panel_says_where_they_computed():
    base = PSConfig(steps=30, eval_every=5, worker_timeout=2.0)  # as the panel's own tests
    panel = ParamServerPanel(runner=LocalRunner(3), base=base)
    assert panel.config().device == "cpu"  # the stored notebooks' default
    assert ParamServerPanel(runner=LocalRunner(3), base=base, device="auto").config().device == "auto"
    result = panel.run()
    assert result is not None, panel.status.value
    assert result.devices == ["cpu", "cpu"]
    assert "2 workers on cpu, shards on the host" in panel.status.value


def test_a_cuda_config_without_a_gpu_fails_on_the_ranks_with_the_fix():
    if gpu_or_simulator():  # a real GPU: the simulator is off in this process
        pytest.skip("this machine has a GPU")
    config = PSConfig(model="bsp", steps=1, batch_size=4, sizes=(4, 4, 2), device="cuda")
    with pytest.raises(Exception, match="numba finds no usable CUDA GPU; use device='cpu'"):
        train(LocalRunner(2), config, TINY, workers=1)


def test_device_summary():
    assert device_summary(["cpu"] * 4) == "4 ranks on cpu"
    assert device_summary(["cuda:0"], "worker") == "1 worker on cuda:0"
    assert device_summary([f"cuda:{i}" for i in range(4)]) == "ranks 0-3 on cuda:0..3"
    assert device_summary(["cuda:1", "cuda:0"]) == "rank 0 on cuda:1, rank 1 on cuda:0"
    assert device_summary(["cpu", None], "worker") == "worker 0 on cpu, worker 1 lost"


class _Spy:
    """A layer backend that records which of its functions were called."""

    def __init__(self, backend):
        self.backend, self.calls = backend, []

    def __getattr__(self, name):
        self.calls.append(name)
        return getattr(self.backend, name)


def test_tensor_parallel_products_run_on_the_layers_kernels():
    mlp = MLP([4, 4, 2], dtype=np.float64, seed=3)
    spy = _Spy(mlp.layers[0]._backend)
    mlp.layers = [dataclasses.replace(layer, _backend=spy) for layer in mlp.layers]
    want_loss, want = MLP([4, 4, 2], dtype=np.float64, seed=3).loss_and_grad(X, Y)

    def step(comm):
        tp = TensorParallelMLP(comm, mlp)
        loss, shards = tp.loss_and_grad(X, Y)
        return loss, tp.full_grad(shards), tp.device

    for loss, grad, device in run_local(step, 2):
        assert device == "cpu" and loss == pytest.approx(want_loss, rel=1e-12)
        np.testing.assert_allclose(grad, want, rtol=1e-10, atol=1e-13)
    # per rank: 2 layer forwards (the row layer's partial product too), 2 backwards
    assert spy.calls.count("layer_forward") == 4 and spy.calls.count("layer_backward") == 4


def test_preflight_probe_without_a_gpu_says_so_and_does_not_crash():
    if gpu_or_simulator():
        pytest.skip("this machine has a GPU")
    gpu = probe()
    assert gpu["gpus"] == 0 and gpu["gpu"] is None and gpu["kernel"] == ""
    assert gpu["error"]  # numba's reason, e.g. the driver library cannot be found
    assert describe(gpu).startswith("no GPU (")
    facts = engine_facts()
    assert facts["gpu"] == gpu
    if facts["gpus"] == 0:  # no nvidia-smi either
        assert gpu_kernel_check([facts]) is None  # a CPU cluster: nothing to check


def test_a_gpu_whose_kernel_fails_fails_the_preflight_with_the_error_text():
    seen = {"gpus": 1, "gpu": 0, "name": "X", "local_rank": 1, "cuda_visible_devices": "1",
            "simulator": False, "kernel": "ok", "error": ""}
    broken = dict(seen, kernel="CudaAPIError: [999] Call to cuCtxCreate results in "
                               "CUDA_ERROR_UNKNOWN")
    facts = [{"gpus": 1, "gpu": seen}, {"gpus": 1, "gpu": broken}, {"gpus": 0, "gpu": {}}]
    check = gpu_kernel_check(facts)
    assert not check.ok and "1 engine(s)" in check.detail and "rank 1:" in check.detail
    assert "CUDA_ERROR_UNKNOWN" in check.detail and "NUMBA_CUDA_DRIVER" in check.fix
    assert "local rank 1 -> GPU 0 of 1 (X; CUDA_VISIBLE_DEVICES=1)" in check.detail
    assert gpu_kernel_check(facts[:1]).ok
