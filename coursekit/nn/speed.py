"""Measuring speed fairly: one thread, best-of timings, and this machine's own peaks.

Used by ``bench/bench_mlp.py`` and the chapter-1 notebook, so both report the same thing:

* :func:`training_steps` - the same training step (forward, backward, SGD update, same
  weights and batch) as coursekit's Numba MLP, the NumPy reference and PyTorch eager;
* :func:`best_time` - seconds per call, the best of several repeats (the least disturbed);
* :func:`measure_matmul_peak` - single-precision matrix-product FLOP/s on this machine
  (SGEMM through NumPy's BLAS), the ceiling the MLP step is compared against;
* :func:`measure_bandwidth` - memory copy bytes/s, the other axis of a roofline;
* :func:`single_thread` - limit the BLAS pools (NumPy's and SciPy's, which Numba calls)
  and PyTorch to one thread, so every contestant uses the same hardware.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np
import scipy.linalg.cython_blas  # noqa: F401  (loads the BLAS Numba calls, so it can be limited)
from threadpoolctl import threadpool_limits

from coursekit.nn import reference
from coursekit.nn.mlp import MLP
from coursekit.nn.optim import SGD

__all__ = ["best_time", "measure_bandwidth", "measure_matmul_peak", "single_thread", "training_steps"]


@contextlib.contextmanager
def single_thread():
    """Run the block with every BLAS / OpenMP pool (and PyTorch, if imported) on one thread.

    threadpoolctl limits the libraries loaded when the block starts; SciPy's BLAS, the
    one ``np.dot`` inside ``@njit`` calls, is imported at the top of this module for that.
    """
    torch = _torch_or_none()
    before = torch.get_num_threads() if torch is not None else None
    with threadpool_limits(limits=1):
        if torch is not None:
            torch.set_num_threads(1)
        try:
            yield
        finally:
            if torch is not None:
                torch.set_num_threads(before)


def best_time(fn, *, repeats: int = 5, min_seconds: float = 0.05) -> float:
    """Seconds per call of ``fn()``: calls are batched to last >= ``min_seconds``, best of ``repeats``."""
    fn()  # warm up (and compile)
    number, elapsed = 1, 0.0
    while True:
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        elapsed = time.perf_counter() - t0
        if elapsed >= min_seconds:
            break
        number *= 2 if elapsed == 0 else max(2, int(min_seconds / elapsed) + 1)
    best = elapsed / number
    for _ in range(repeats - 1):
        t0 = time.perf_counter()
        for _ in range(number):
            fn()
        best = min(best, (time.perf_counter() - t0) / number)
    return best


def measure_matmul_peak(n: int = 1024, dtype=np.float32, repeats: int = 5, min_seconds: float = 0.05) -> float:
    """FLOP/s of an (n x n) @ (n x n) product into a preallocated result: 2 n^3 / seconds."""
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(dtype) for _ in range(2))
    c = np.empty_like(a)
    return 2 * n**3 / best_time(lambda: np.dot(a, b, out=c), repeats=repeats, min_seconds=min_seconds)


def measure_bandwidth(nbytes: int = 64 * 2**20, repeats: int = 5) -> float:
    """Bytes/s of a large array copy, counting the read and the write (2 * nbytes per copy)."""
    src = np.ones(nbytes // 8)
    dst = np.empty_like(src)
    return 2 * src.nbytes / best_time(lambda: np.copyto(dst, src), repeats=repeats)


def _torch_or_none():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _torch_step(model: MLP, X, y, lr):
    """PyTorch eager: nn.Sequential of Linear + activation with the MLP's weights, SGD."""
    import torch

    acts = {"relu": torch.nn.ReLU, "sigmoid": torch.nn.Sigmoid, "tanh": torch.nn.Tanh}
    modules = []
    for layer in model.layers:
        linear = torch.nn.Linear(*layer.W.shape, dtype=getattr(torch, model.dtype.name))
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(layer.W.T))  # PyTorch stores (out, in)
            linear.bias.copy_(torch.from_numpy(layer.b))
        modules += [linear, acts[model.activation]()]
    net = torch.nn.Sequential(*modules[:-1])  # the output layer is linear
    opt = torch.optim.SGD(net.parameters(), lr=lr)
    Xt, yt = torch.from_numpy(X), torch.from_numpy(y)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(net(Xt), yt)
        loss.backward()
        opt.step()
        return loss

    return step, net


def training_steps(model: MLP, X, y, lr: float = 0.01, *, torch: bool = True) -> dict:
    """One SGD step on (X, y) per contestant, each on its own copy of ``model``'s weights.

    Returns {"numba": step, "numpy": step, "pytorch": step (when installed and ``torch``)};
    each ``step()`` updates its copy in place. The attribute ``step.params`` (NumPy
    contestants) or ``step.net`` (PyTorch) exposes the copy, so tests can compare them.
    Only the softmax cross-entropy loss is supported here.
    """
    if model.loss != "softmax_xent":
        raise ValueError(f"training_steps compares softmax_xent models; got loss={model.loss!r}")
    X, y = model.check_batch(X, y)
    fast = model.copy()
    grad = np.empty_like(fast.params)
    opt = SGD(fast.params, lr)

    def numba_step():
        fast.loss_and_grad(X, y, out=grad, validate=False)
        opt.step(grad)

    ref_params = model.params.copy()

    def numpy_step():
        _, g = reference.loss_and_grad(ref_params, model.sizes, model.activation, model.loss, X, y)
        ref_params[...] -= model.dtype.type(lr) * g

    numba_step.params, numpy_step.params = fast.params, ref_params
    steps = {"numba": numba_step, "numpy": numpy_step}
    if torch and _torch_or_none() is not None:
        step, step.net = _torch_step(model, X, y, lr)
        steps["pytorch"] = step
    return steps
