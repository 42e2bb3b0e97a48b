"""numba.cuda kernels vs NumPy and the CPU kernels, under NUMBA_ENABLE_CUDASIM=1 (run by
test_nn_cuda.py).

The simulator runs every GPU thread as a Python thread, so the cases are small; the
matrix product's tile is 8 x 8 there (4 x 4 threads of 2 x 2, slabs of K of 4) and the
simulated GPU has 8 SMs, so these shapes (sized from the tile) still cross several tiles,
partial edges and split-K. Tolerances: float64 1e-12 relative (only the summation order
differs), float32 1e-5 (idem, in float32), fp16 against the CPU emulation: the same 16-bit
values except where a different float32 summation order flips one rounding (see each test).

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
from coursekit.nn.mixed_precision import LossScaler, MixedPrecision  # noqa: E402

cuda = kernels_cuda.cuda
TILE = kernels_cuda.TILE
M, K, N = TILE.BM + 3, 3 * TILE.BK + 1, TILE.BN + 2  # 11, 13, 10 in the simulator
ACTS = {0: lambda z: z, 1: lambda z: np.maximum(z, 0), 2: lambda z: 1 / (1 + np.exp(-z)),
        3: np.tanh}


def _operands(rng, m, k, n, trans_a, trans_b, dtype=np.float64):
    A = rng.standard_normal((k, m) if trans_a else (m, k)).astype(dtype)
    B = rng.standard_normal((n, k) if trans_b else (k, n)).astype(dtype)
    return A, B


@pytest.mark.parametrize("trans_a, trans_b", [(False, False), (False, True), (True, False), (True, True)])
def test_tiled_matmul_matches_numpy(trans_a, trans_b):
    rng = np.random.default_rng(0)
    # more than one tile each way, none a multiple of it; 4 slabs of K, the last one partial
    A, B = _operands(rng, M, K, N, trans_a, trans_b)
    want = (A.T if trans_a else A) @ (B.T if trans_b else B)
    for splits in (1, 2):  # one pass over K, and split-K (partials, then the reduce kernel)
        got = kernels_cuda._matmul(cuda.to_device(A), cuda.to_device(B), trans_a, trans_b,
                                   splits=splits)
        np.testing.assert_allclose(got.copy_to_host(), want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("act", [1, 2, 3])
def test_matmul_epilogue_adds_the_bias_and_applies_the_activation(act):
    rng = np.random.default_rng(act)
    A, B = _operands(rng, M, K, N, False, False)
    b = rng.standard_normal(N)
    want = ACTS[act](A @ B + b)
    for splits in (1, 3):  # fused in the product's store, or in the split-K reduce
        got = kernels_cuda._matmul(cuda.to_device(A), cuda.to_device(B), False, False,
                                   bias=cuda.to_device(b), act=act, splits=splits)
        np.testing.assert_allclose(got.copy_to_host(), want, rtol=1e-12, atol=1e-12)


def test_matmul_stores_float16_but_accumulates_in_float32():
    k = 3 * TILE.BK + 1
    A = np.full((1, k), 2.0**-11, np.float16)
    A[0, 0] = 1  # 1 + 2^-11 ties to even back to 1 in fp16: an fp16 accumulator stays at 1
    B = np.ones((k, 1), np.float16)
    got = kernels_cuda._matmul(cuda.to_device(A), cuda.to_device(B), False, False, splits=1)
    assert got.dtype == np.float16
    assert got.copy_to_host()[0, 0] == np.float16(1 + (k - 1) * 2.0**-11) != 1
    rng = np.random.default_rng(3)
    A, B = _operands(rng, M, K, N, True, False, np.float16)
    got = kernels_cuda._matmul(cuda.to_device(A), cuda.to_device(B), True, False).copy_to_host()
    want = (A.T.astype(np.float32) @ B.astype(np.float32)).astype(np.float16)
    # float32 sums in another order: at most one fp16 rounding apart
    assert np.all(np.abs(got.astype(np.float32) - want) <= np.spacing(np.abs(want)))


@pytest.mark.parametrize(
    "activation, loss, dtype",
    [("relu", "softmax_xent", np.float32), ("sigmoid", "mse", np.float64), ("tanh", "softmax_xent", np.float64)],
)
def test_loss_and_grad_and_forward_match_cpu(activation, loss, dtype):
    sizes = (17, 10, 3)  # 9 x 17 @ 17 x 10 spans 2 x 2 tiles of 8 x 8, 5 slabs of K
    cpu = MLP(sizes, activation, loss, dtype=dtype, seed=2)
    gpu = MLP(sizes, activation, loss, dtype=dtype, seed=2, device="cuda")
    assert gpu.device == "cuda"
    rng = np.random.default_rng(1)
    X, y = rng.standard_normal((9, 17)), rng.integers(0, 3, 9)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    l_cpu, g_cpu = cpu.loss_and_grad(X, y)
    l_gpu, g_gpu = gpu.loss_and_grad(X, y)
    assert l_gpu == pytest.approx(l_cpu, rel=tol)
    np.testing.assert_allclose(g_gpu, g_cpu, rtol=tol * 10, atol=tol)
    np.testing.assert_allclose(gpu.forward(X), cpu.forward(X), rtol=tol * 10, atol=tol)


@pytest.mark.parametrize("activation, loss", [("relu", "softmax_xent"), ("tanh", "mse")])
def test_fp16_step_on_the_gpu_matches_the_cpu_emulation(activation, loss):
    model = MLP((17, 10, 3), activation, loss, seed=2)
    rng = np.random.default_rng(1)
    X, y = rng.standard_normal((9, 17)), rng.integers(0, 3, 9)
    cpu = MixedPrecision(model.copy(), "fp16", scaler=LossScaler(2.0**10))
    gpu = MixedPrecision(model.copy(), "fp16", scaler=LossScaler(2.0**10), device="cuda")
    assert (cpu.device, gpu.device) == ("cpu", "cuda")
    (l_cpu, g_cpu), (l_gpu, g_gpu) = cpu.loss_and_grad(X, y), gpu.loss_and_grad(X, y)
    assert l_gpu == pytest.approx(l_cpu, rel=1e-6)  # the loss is computed in fp32 on both
    # the 16-bit gradients: the same values but where float32 sums in another order flip a
    # rounding (none in this case so far; allow 2 %), and then one fp16 step apart
    assert gpu.grad16.dtype == np.float16
    assert np.mean(gpu.grad16 == cpu.grad16) >= 0.98
    g16c, g16g = cpu.grad16.astype(np.float32), gpu.grad16.astype(np.float32)
    assert np.all(np.abs(g16g - g16c) <= np.spacing(np.abs(cpu.grad16)).astype(np.float32))
    np.testing.assert_allclose(g_gpu, g_cpu, rtol=2.0**-10, atol=2.0**-10 * np.abs(g_cpu).max())
    assert gpu.peak == pytest.approx(cpu.peak, rel=2.0**-10)  # after vs before one rounding
    assert [a.shape for a in gpu.activations] == [a.shape for a in cpu.activations]
    assert gpu.memory() == cpu.memory()
    np.testing.assert_allclose(gpu.forward(X), cpu.forward(X), rtol=2.0**-10, atol=2.0**-10)


def test_fp16_on_the_gpu_overflows_and_skips_like_the_emulation():
    model = MLP((17, 10, 3), "relu", seed=2)
    rng = np.random.default_rng(1)
    X, y = rng.standard_normal((9, 17)), rng.integers(0, 3, 9)
    mps = [MixedPrecision(model.copy(), "fp16", scaler=LossScaler(2.0**24), device=d)
           for d in ("cpu", "cuda")]
    for mp in mps:
        mp.step(X, y)
        assert mp.scaler.skipped.tolist() == [True] and mp.scaler.scale == 2.0**23
        assert mp.peak == np.inf
        np.testing.assert_array_equal(mp.model.params, model.params)  # not updated


def test_mixed_precision_device_choices():
    model = MLP((3, 2), seed=0)
    assert MixedPrecision(model, "fp16", device="auto").device == "cuda"  # a (simulated) GPU
    assert MixedPrecision(model, "fp32", device="cuda").device == "cuda"
    assert MixedPrecision(model, "bf16", device="auto").device == "cpu"  # runs only emulated
    with pytest.raises(ValueError, match="fmt='bf16' cannot run on device='cuda'"):
        MixedPrecision(model, "bf16", device="cuda")
    with pytest.raises(ValueError, match="device='gpu' is not supported"):
        MixedPrecision(model, "fp16", device="gpu")


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


def test_split_k_workspace_is_one_per_thread():
    """Thread ranks share the GPU's stream: a shared split-K buffer let one rank's partials
    overwrite another's between its two kernels (on an H200), so each thread has its own."""
    import threading

    mine = kernels_cuda._workspace((4, 5), np.float32)
    mine.copy_to_device(np.ones((4, 5), np.float32))
    again = kernels_cuda._workspace((4, 5), np.float32)  # reused within a thread
    np.testing.assert_array_equal(again.copy_to_host(), 1)

    def other_rank():
        kernels_cuda._workspace((4, 5), np.float32).copy_to_device(np.zeros((4, 5), np.float32))

    worker = threading.Thread(target=other_rank)
    worker.start()
    worker.join()
    np.testing.assert_array_equal(mine.copy_to_host(), 1)


# -- the step's device buffers: cached per thread and shape ---------------------------

def _count_device_allocations(monkeypatch) -> list:
    """Record every call of numba's device allocation entry points from now on."""
    calls = []
    for name in ("device_array", "device_array_like", "to_device", "pinned_array",
                 "mapped_array"):
        real = getattr(cuda, name)

        def counting(*args, _real=real, _name=name, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(cuda, name, counting)
    return calls


def _fresh_step_cache():
    kernels_cuda._THIS_THREAD.__dict__.pop("steps", None)


def _batch(rng, n, sizes, loss, dtype):
    X = rng.standard_normal((n, sizes[0])).astype(dtype)
    y = rng.integers(0, sizes[-1], n)
    return X, y


def test_a_second_step_of_the_same_shape_allocates_nothing_on_the_device(monkeypatch):
    sizes = (5, 6, 4, 3)  # two hidden layers: gradients flow into both
    for loss, dtype in (("softmax_xent", np.float32), ("mse", np.float64)):
        _fresh_step_cache()
        gpu = MLP(sizes, "tanh", loss, dtype=dtype, seed=5, device="cuda")
        rng = np.random.default_rng(6)
        X, y = _batch(rng, 6, sizes, loss, dtype)
        gpu.loss_and_grad(X, y)  # warm-up: allocates this shape's buffers
        X, y = _batch(rng, 6, sizes, loss, dtype)  # same shape, new values
        with monkeypatch.context() as m:
            calls = _count_device_allocations(m)
            got = gpu.loss_and_grad(X, y)
        assert calls == []
        cpu = MLP(sizes, "tanh", loss, dtype=dtype, seed=5)
        want = cpu.loss_and_grad(X, y)
        tol = 1e-5 if dtype == np.float32 else 1e-12
        assert got[0] == pytest.approx(want[0], rel=tol)
        np.testing.assert_allclose(got[1], want[1], rtol=tol * 10, atol=tol)


@pytest.mark.parametrize("loss, dtype", [("softmax_xent", np.float32), ("mse", np.float64)])
def test_cached_steps_equal_fresh_ones_and_the_cpu_across_batch_sizes(loss, dtype):
    """Batch sizes 6, 3, 6 in a row: a cached buffer of another shape is never used, and a
    cached step gives bit for bit what a step on fresh buffers gives."""
    sizes = (5, 6, 4, 3)
    gpu = MLP(sizes, "relu", loss, dtype=dtype, seed=7, device="cuda")
    cpu = MLP(sizes, "relu", loss, dtype=dtype, seed=7)
    rng = np.random.default_rng(8)
    tol = 1e-5 if dtype == np.float32 else 1e-12
    _fresh_step_cache()
    for i, n in enumerate((6, 3, 6)):
        X, y = _batch(rng, n, sizes, loss, dtype)
        cached = gpu.loss_and_grad(X, y)
        assert len(kernels_cuda._THIS_THREAD.steps) == min(i + 1, 2)  # one set per shape
        saved = kernels_cuda._THIS_THREAD.steps
        _fresh_step_cache()  # the same step on buffers allocated for it alone
        fresh = gpu.loss_and_grad(X, y)
        kernels_cuda._THIS_THREAD.steps = saved
        assert cached[0] == fresh[0] and np.array_equal(cached[1], fresh[1])
        want = cpu.loss_and_grad(X, y)
        assert cached[0] == pytest.approx(want[0], rel=tol)
        np.testing.assert_allclose(cached[1], want[1], rtol=tol * 10, atol=tol)


STEP_CACHE_SIZE = kernels_cuda.STEP_CACHE_SIZE


def test_step_buffers_are_one_set_per_thread():
    """Thread ranks share the GPU's stream: a rank staging its batch must not overwrite
    another rank's, so each thread has its own buffers even for the same shape."""
    import threading

    sizes = np.array([4, 6, 3])
    params = MLP(tuple(sizes), dtype=np.float64, seed=1).params
    y = np.zeros(5, np.int64)
    mine = kernels_cuda.stage_in(params, np.ones((5, 4)), y, sizes)
    theirs = []

    def other_rank():
        theirs.append(kernels_cuda.stage_in(params, np.zeros((5, 4)), y, sizes))

    worker = threading.Thread(target=other_rank)
    worker.start()
    worker.join()
    np.testing.assert_array_equal(mine.X.copy_to_host(), 1)
    ours = [id(a) for a in (*mine[:5], *mine.acts, *mine.input_grads)]
    assert not set(ours) & {id(a) for a in (*theirs[0][:5], *theirs[0].acts)}
    assert kernels_cuda.stage_in(params, np.ones((5, 4)), y, sizes).X is mine.X  # reused


def test_the_step_cache_keeps_the_most_recent_shapes(monkeypatch):
    sizes = np.array([4, 6, 3])
    params = MLP(tuple(sizes), dtype=np.float32, seed=1).params
    _fresh_step_cache()
    for n in range(1, STEP_CACHE_SIZE + 4):  # a sweep over batch sizes
        kernels_cuda.stage_in(params, np.ones((n, 4), np.float32), np.zeros(n, np.int64), sizes)
        assert len(kernels_cuda._THIS_THREAD.steps) == min(n, STEP_CACHE_SIZE)
    kept = sorted(key[5][0] for key in kernels_cuda._THIS_THREAD.steps)
    assert kept == list(range(4, STEP_CACHE_SIZE + 4))  # the newest shapes
    for n, allocates in ((4, False), (1, True)):  # kept, then evicted long ago
        with monkeypatch.context() as m:
            calls = _count_device_allocations(m)
            kernels_cuda.stage_in(params, np.ones((n, 4), np.float32), np.zeros(n, np.int64),
                                  sizes)
        assert bool(calls) == allocates
    assert len(kernels_cuda._THIS_THREAD.steps) == STEP_CACHE_SIZE
