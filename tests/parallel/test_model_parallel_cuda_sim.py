"""Chapters 4, 5 and 8 with ``device="cuda"`` equal ``device="cpu"``, in numba's CUDA simulator.

Run by ``tests/parallel/test_device_switch.py`` in its own pytest process with
``NUMBA_ENABLE_CUDASIM=1`` (:func:`cudasim.run_in_simulator`), or on a real GPU where numba
finds one (then in the main run too, the ranks launching from several threads at once).
The simulator cannot run launches from several threads at once (it swaps the kernels'
module globals during a launch: without the turns the PS run failed with
"'FakeCUDAModule' object has no attribute 'to_device'"), so kernels_cuda makes them take
turns there; the ranks still run as ThreadComm threads, each launching its own kernels.
Sizes are tiny: the simulator runs every GPU thread as a Python thread. All the ranks share
the one GPU, so every rank reports "cuda:0".
"""

import os

import numpy as np
import pytest

import numba  # noqa: E402
from cudasim import gpu_or_simulator  # noqa: E402

if not gpu_or_simulator():
    pytest.skip("needs a GPU, or its own process with NUMBA_ENABLE_CUDASIM=1 "
                "(see test_device_switch.py)", allow_module_level=True)

from coursekit.cluster.gpu_probe import probe  # noqa: E402
from coursekit.cluster.preflight import engine_facts, gpu_kernel_check  # noqa: E402
from coursekit.cluster.runner import LocalRunner  # noqa: E402
from coursekit.data import Dataset  # noqa: E402
from coursekit.nn import MLP  # noqa: E402
from coursekit.parallel.param_server import PSConfig, train  # noqa: E402
from coursekit.parallel.pipeline import run_pipeline, schedule  # noqa: E402
from coursekit.parallel.tensor_parallel import TensorParallelMLP  # noqa: E402
from coursekit.parallel.zero import train_zero  # noqa: E402

RNG = np.random.default_rng(7)
X = RNG.standard_normal((8, 4))
Y = RNG.integers(0, 2, 8)
DATA = Dataset("tiny", X, Y, X[:4], Y[:4], 2)


def both(dtype=np.float64, sizes=(4, 4, 2)):
    """The same MLP twice: on the host and on the (simulated) GPU."""
    return (MLP(sizes, dtype=dtype, seed=3), MLP(sizes, dtype=dtype, seed=3, device="cuda"))


@pytest.mark.parametrize("dtype, rtol", [("float64", 1e-12), ("float32", 1e-5)])
def test_bsp_parameter_server_on_cuda_equals_cpu(dtype, rtol):
    """float32: the tiled GPU product sums in another order than BLAS: ~1e-7 per step."""
    runs = {}
    for device in ("cpu", "cuda"):
        config = PSConfig(model="bsp", steps=2, batch_size=4, lr=0.5, sizes=(4, 4, 2),
                          dtype=dtype, eval_every=100, device=device)
        runs[device] = train(LocalRunner(3), config, DATA, workers=2)
    cpu, gpu = runs["cpu"], runs["cuda"]
    assert cpu.devices == ["cpu", "cpu"] and gpu.devices == ["cuda:0", "cuda:0"]
    assert gpu.applied == cpu.applied == 4  # 2 workers x 2 steps
    assert not np.array_equal(gpu.params, PSConfig(sizes=(4, 4, 2), dtype=dtype).initial_params())
    np.testing.assert_allclose(gpu.params, cpu.params, rtol=rtol, atol=rtol)


def tp_grad(comm, mlp):
    tp = TensorParallelMLP(comm, mlp)
    loss, shards = tp.loss_and_grad(X, Y)
    return loss, tp.full_grad(shards), tp.device


def test_tensor_parallel_on_cuda_equals_cpu():
    cpu, gpu = both(sizes=(4, 4, 2))  # layer 0 column-, layer 1 row-parallel over 2 ranks
    want_loss, want = cpu.loss_and_grad(X, Y)
    for loss, grad, device in LocalRunner(2).run(tp_grad, gpu):
        assert device == "cuda:0"
        assert loss == pytest.approx(want_loss, rel=1e-12)
        np.testing.assert_allclose(grad, want, rtol=1e-10, atol=1e-13)


def test_pipeline_on_cuda_equals_cpu_and_zero_bubble_is_refused():
    cpu, gpu = both()  # 2 layers: one per stage
    want_loss, want = cpu.loss_and_grad(X, Y)
    run = run_pipeline(LocalRunner(2), schedule("1f1b", 2, 2), (X, Y), mlp=gpu)
    assert run.devices == ["cuda:0", "cuda:0"]
    assert run.loss == pytest.approx(want_loss, rel=1e-12)
    np.testing.assert_allclose(run.grad, want, rtol=1e-10, atol=1e-13)
    with pytest.raises(ValueError, match=r"splits the backward .*device='cuda'; allowed: .*1f1b"):
        run_pipeline(LocalRunner(2), schedule("zb_h1", 2, 2), (X, Y), mlp=gpu)


def test_zero_stage_3_on_cuda_equals_cpu():
    cpu, gpu = both()
    kw = dict(stage=3, steps=1, batch_size=4, lr=0.5)
    want = LocalRunner(2).run(train_zero, cpu, X, Y, **kw)
    got = LocalRunner(2).run(train_zero, gpu, X, Y, **kw)
    assert [r.device for r in got] == ["cuda:0", "cuda:0"] and want[0].device == "cpu"
    for g, w in zip(got, want):
        np.testing.assert_allclose(g.params, w.params, rtol=1e-12, atol=1e-14)
        np.testing.assert_allclose(g.losses, w.losses, rtol=1e-12)


def test_the_preflight_probe_runs_a_kernel_on_the_simulated_gpu():
    gpu = probe()
    assert gpu["gpus"] >= 1 and gpu["gpu"] == 0 and gpu["simulator"] == numba.config.ENABLE_CUDASIM
    assert gpu["kernel"] == "ok" and gpu["error"] == ""
    facts = engine_facts()
    assert facts["gpus"] >= 1
    check = gpu_kernel_check([facts])
    assert check.ok and "test kernel" in check.detail
