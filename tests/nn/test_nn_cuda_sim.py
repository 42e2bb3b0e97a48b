"""numba.cuda kernels vs the CPU kernels, under NUMBA_ENABLE_CUDASIM=1 (run by test_nn_cuda.py).

The simulator runs every GPU thread as a Python thread, so the cases are small; the
tile is 4 x 4 there, so these shapes still cross several tiles and partial edges.

``COURSEKIT_CUDA_TESTS=device`` runs the same equality tests on a real GPU instead
(``make test-gpu``); there a machine without a usable GPU fails them instead of skipping.
"""

import os

import numpy as np
import pytest

ON_DEVICE = os.environ.get("COURSEKIT_CUDA_TESTS") == "device"
if ON_DEVICE:
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        pytest.fail("COURSEKIT_CUDA_TESTS=device runs these tests on a real GPU: unset "
                    "NUMBA_ENABLE_CUDASIM", pytrace=False)
    from numba import cuda as _cuda

    if not _cuda.is_available():
        pytest.fail("COURSEKIT_CUDA_TESTS=device but numba finds no usable CUDA GPU "
                    "(make test runs these tests in the simulator)", pytrace=False)
elif os.environ.get("NUMBA_ENABLE_CUDASIM") != "1":
    pytest.skip("runs in its own process with NUMBA_ENABLE_CUDASIM=1 (see test_nn_cuda.py), "
                "or on a GPU with COURSEKIT_CUDA_TESTS=device", allow_module_level=True)

from coursekit.nn import MLP, kernels_cuda, reference  # noqa: E402


@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (False, True), (True, False), (True, True)])
def test_tiled_matmul_matches_numpy(trans_a, trans_b):
    rng = np.random.default_rng(0)
    m, k, n = 5, 9, 6  # not multiples of the 4 x 4 tile
    A = rng.standard_normal((k, m) if trans_a else (m, k))
    B = rng.standard_normal((n, k) if trans_b else (k, n))
    want = (A.T if trans_a else A) @ (B.T if trans_b else B)
    got = kernels_cuda._matmul(kernels_cuda.cuda.to_device(A), kernels_cuda.cuda.to_device(B), trans_a, trans_b)
    np.testing.assert_allclose(got.copy_to_host(), want, rtol=1e-12)


@pytest.mark.parametrize(
    "activation, loss, dtype",
    [("relu", "softmax_xent", np.float32), ("sigmoid", "mse", np.float64), ("tanh", "softmax_xent", np.float64)],
)
def test_loss_and_grad_and_forward_match_cpu(activation, loss, dtype):
    sizes = (7, 9, 5, 3)
    cpu = MLP(sizes, activation, loss, dtype=dtype, seed=2)
    gpu = MLP(sizes, activation, loss, dtype=dtype, seed=2, device="cuda")
    assert gpu.device == "cuda"
    rng = np.random.default_rng(1)
    X, y = rng.standard_normal((6, 7)), rng.integers(0, 3, 6)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    l_cpu, g_cpu = cpu.loss_and_grad(X, y)
    l_gpu, g_gpu = gpu.loss_and_grad(X, y)
    assert l_gpu == pytest.approx(l_cpu, rel=tol)
    np.testing.assert_allclose(g_gpu, g_cpu, rtol=tol * 10, atol=tol)
    np.testing.assert_allclose(gpu.forward(X), cpu.forward(X), rtol=tol * 10, atol=tol)


def test_single_layer_on_the_gpu_matches_reference():
    gpu = MLP([5, 6, 2], "sigmoid", dtype=np.float64, seed=3, device="cuda")
    layer = gpu.layers[0]
    rng = np.random.default_rng(2)
    a_prev = rng.standard_normal((3, 5))
    a = layer.forward(a_prev)
    np.testing.assert_allclose(a, reference.layer_forward(layer.W, layer.b, a_prev, "sigmoid"), rtol=1e-12)
    grad_a = rng.standard_normal(a.shape)
    g_prev, g = layer.backward(a_prev, a, grad_a)
    dW, db, want_prev = reference.layer_backward(layer.W, a_prev, a, grad_a, "sigmoid")
    np.testing.assert_allclose(g, np.concatenate([dW.ravel(), db]), rtol=1e-12)
    np.testing.assert_allclose(g_prev, want_prev, rtol=1e-12)


def test_an_engine_binds_the_gpu_of_its_local_rank(monkeypatch):
    from numba import cuda

    from coursekit import cluster

    kernels_cuda.bind_engine_gpu.cache_clear()
    assert kernels_cuda.bind_engine_gpu() is None  # not on an engine: nothing is bound
    kernels_cuda.bind_engine_gpu.cache_clear()
    engine = cluster.EngineInfo(rank=5, size=8, mpi=False, host="h", pid=1, local_rank=3, local_size=4)
    monkeypatch.setattr(cluster, "_this_engine", engine)
    assert MLP([3, 2], device="cuda").device == "cuda"
    assert kernels_cuda.bind_engine_gpu() == 3 % len(cuda.gpus)
    kernels_cuda.bind_engine_gpu.cache_clear()


def test_a_timed_gpu_step_is_staged_computed_and_staged_back_with_the_same_result():
    from contextlib import contextmanager

    parts = []

    @contextmanager
    def timer(part):
        parts.append(part)
        yield

    rng = np.random.default_rng(4)
    X, y = rng.standard_normal((5, 4)), rng.integers(0, 3, 5)
    gpu = MLP((4, 6, 3), dtype=np.float64, seed=1, device="cuda")
    want_loss, want_grad = gpu.loss_and_grad(X, y)
    grad = np.empty_like(gpu.params)
    loss, out = gpu.loss_and_grad(X, y, out=grad, timer=timer)
    assert parts == ["stage", "compute", "stage"] and out is grad
    assert loss == want_loss and np.array_equal(grad, want_grad)
    cpu_loss, cpu_grad = MLP((4, 6, 3), dtype=np.float64, seed=1).loss_and_grad(X, y)
    np.testing.assert_allclose(grad, cpu_grad, rtol=1e-12, atol=1e-14)
    parts.clear()
    MLP((4, 6, 3), seed=1).loss_and_grad(X, y, timer=timer)
    assert parts == ["compute"]  # nothing to stage on the CPU
