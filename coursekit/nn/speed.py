"""Measuring speed fairly: one thread, best-of timings, and this machine's own peaks.

Used by ``bench/bench_mlp.py`` and the chapter-1 notebook, so both report the same thing:

* :func:`training_steps` - the same training step (forward, backward, SGD update, same
  weights and batch) as coursekit's Numba MLP, a tight hand-written NumPy step
  (:class:`TightNumpyStep`), the readable NumPy reference and PyTorch eager;
* :func:`best_time` - seconds per call, the best of several repeats (the least disturbed);
* :func:`measure_matmul_peak` - single-precision matrix-product FLOP/s on this machine
  (SGEMM through NumPy's BLAS), the ceiling the MLP step is compared against;
* :func:`measure_bandwidth` - memory copy bytes/s, the other axis of a roofline;
* :func:`products_only` - one step's matrix products alone, as the Numba step calls BLAS:
  the ceiling of any step built on those calls (the rest is elementwise work and Python);
* :func:`single_thread` - limit the BLAS pools (NumPy's and SciPy's, which Numba calls)
  and PyTorch to one thread, so every contestant uses the same hardware.
"""

from __future__ import annotations

import contextlib
import time

import numpy as np
import scipy.linalg.cython_blas  # noqa: F401  (loads the BLAS Numba calls, so it can be limited)
from numba import njit
from threadpoolctl import threadpool_limits

from coursekit import checks
from coursekit.nn import kernels_cpu, layout, reference
from coursekit.nn.mlp import MLP
from coursekit.nn.optim import SGD

__all__ = [
    "TightNumpyStep",
    "best_time",
    "measure_bandwidth",
    "measure_matmul_peak",
    "products_only",
    "single_thread",
    "training_steps",
]


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
    if not callable(fn):
        raise TypeError(f"fn must be a function fn() to time; got {type(fn).__name__} {fn!r:.60}")
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
    n = checks.integer(n, "n", at_least=1)
    dtype = checks.float_dtype(dtype)
    checks.fits_in_memory(n * n * (3 * dtype.itemsize + 8), "n", "three n x n matrices")
    rng = np.random.default_rng(0)
    a, b = (rng.standard_normal((n, n)).astype(dtype) for _ in range(2))
    c = np.empty_like(a)
    return 2 * n**3 / best_time(lambda: np.dot(a, b, out=c), repeats=repeats, min_seconds=min_seconds)


def measure_bandwidth(nbytes: int = 64 * 2**20, repeats: int = 5) -> float:
    """Bytes/s of a large array copy, counting the read and the write (2 * nbytes per copy)."""
    nbytes = checks.integer(nbytes, "nbytes", at_least=8)
    checks.fits_in_memory(2 * nbytes, "nbytes", "the source and destination arrays")
    src = np.ones(nbytes // 8)
    dst = np.empty_like(src)
    return 2 * src.nbytes / best_time(lambda: np.copyto(dst, src), repeats=repeats)


@njit(cache=True)
def _block(flat, sizes, layer, n):
    """The (n, sizes[layer]) block ``layer`` of ``flat``, where the blocks lie one after another."""
    start = 0
    for i in range(layer):
        start += n * sizes[i]
    return flat[start : start + n * sizes[layer]].reshape((n, sizes[layer]))


@njit(cache=True)
def _products(params, grad, sizes, n, acts, deltas, w_t):
    """The matrix products of ``kernels_cpu.loss_and_grad_xent``, in its order, nothing else."""
    n_layers = len(sizes) - 1
    for layer in range(n_layers):
        W, _ = kernels_cpu._layer_view(params, sizes, layer)
        np.dot(_block(acts, sizes, layer, n), W, _block(acts, sizes, layer + 1, n))
    for layer in range(n_layers - 1, -1, -1):
        W, _ = kernels_cpu._layer_view(params, sizes, layer)
        dW, _ = kernels_cpu._layer_view(grad, sizes, layer)
        delta = _block(deltas, sizes, layer + 1, n)
        np.dot(_block(acts, sizes, layer, n).T, delta, dW)
        if layer > 0:
            G_prev = _block(deltas, sizes, layer, n)
            if W.size <= kernels_cpu._SMALL_W:  # as layer_backward: a C-ordered copy of W^T
                W_t, _ = kernels_cpu._layer_view(w_t, sizes, layer)
                np.dot(delta, W_t.reshape((W.shape[1], W.shape[0])), G_prev)
            else:
                np.dot(delta, W.T, G_prev)


def products_only(model: MLP, batch: int):
    """A function running one training step's matrix products alone, as the Numba step does.

    Forward A^l = A^(l-1) W_l; backward dW_l = A^(l-1)^T delta^l and, above the first layer,
    G^(l-1) = delta^l W_l^T (through a C-ordered copy of W^T made once here, for a W of at most
    ``kernels_cpu._SMALL_W`` values, as ``kernels_cpu.layer_backward`` multiplies): the
    ``np.dot`` (BLAS) calls of ``model.loss_and_grad`` with the same shapes and operand
    layouts, in one compiled call with arguments of the kernel's kinds, and no elementwise
    work. Its time is the least a step built on those calls can take: it does
    ``flops.mlp_step_flops(model.sizes, batch)["total"]`` FLOPs.

    The function's attributes ``acts`` ([A^0, ..., A^L], random), ``deltas`` ([delta^0, ...,
    delta^L]: delta^L random, the lower ones written by the calls) and ``grad`` (flat, dW
    written) are its arrays, so the products can be checked.
    """
    if not isinstance(model, MLP) or model.device != "cpu":
        raise TypeError(f"model must be a CPU coursekit.nn.MLP; got {model!r:.60}")
    n = checks.integer(batch, "batch", at_least=1)
    sizes, dt = model.sizes, model.dtype
    rng = np.random.default_rng(0)
    acts = rng.standard_normal(n * sum(sizes)).astype(dt)
    deltas = rng.standard_normal(n * sum(sizes)).astype(dt)
    w_t = np.zeros_like(model.params)  # W_l^T in W_l's place of the flat layout
    for layer in model.layers:
        w_t[layer.span][: layer.W.size] = layer.W.T.ravel()
    params, grad, sizes_arr = model.params, np.zeros_like(model.params), model._sizes_arr

    def run():
        _products(params, grad, sizes_arr, n, acts, deltas, w_t)

    blocks = np.cumsum([0, *(n * m for m in sizes)])
    run.acts, run.deltas = ([flat[a:b].reshape(n, m) for a, b, m in zip(blocks, blocks[1:], sizes)]
                            for flat in (acts, deltas))
    run.grad = grad
    return run


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


class TightNumpyStep:
    """The SGD step a competent NumPy user writes for speed: the fair NumPy baseline.

    Softmax cross-entropy, hidden layers ``activation`` (relu, sigmoid or tanh), linear
    output layer: the same step as ``MLP.loss_and_grad`` + ``SGD.step``, written in plain
    NumPy, float32 or float64, on ``params`` (a flat buffer in coursekit's layout, updated
    in place). Unlike :mod:`coursekit.nn.reference`, which is written to be read, it

    * allocates nothing per step that grows with the network: activations, deltas, masks
      and the gradient live in buffers made once for this batch size, and every matrix
      product writes into one with ``np.dot(..., out=)``;
    * works in place (``z += b``, ``np.maximum(z, 0, out=z)``, ``np.exp(z, out=z)``);
    * fuses the softmax + cross-entropy gradient: delta^L = lr (softmax(z) - onehot(y)) / n
      is made in the logits' buffer, with the learning rate folded in so that the update
      is one ``params -= buffer`` over the flat buffer;
    * computes bias gradients as ``ones @ delta`` (a BLAS call, faster than ``sum(axis=0)``
      at these sizes) and checks nothing: ``X`` must be a C-contiguous array of the
      parameters' dtype with ``batch`` rows and ``y`` integer labels in range.

    The loop over layers stays (a Python loop over prebuilt tuples of buffers): the step
    works for any depth, as coursekit's does. Measured and dropped: folding the bias into
    the products ([A, 1] @ [W; b]) saved about 1 us of ~34 on the 64-128-10 net; a
    contiguous copy of W^T for delta @ W^T saved nothing.
    """

    def __init__(self, params: np.ndarray, sizes, activation: str, batch: int, lr: float):
        if activation not in ("relu", "sigmoid", "tanh"):
            raise ValueError(f"activation={activation!r} is not supported; allowed: relu, sigmoid, tanh")
        dt = params.dtype
        n = int(batch)
        self.params, self.activation, self.n = params, activation, n
        self.buffer = np.empty_like(params)  # lr * dC/dparams after a step
        ws, gs = layout.views(params, sizes), layout.views(self.buffer, sizes)
        acts = [np.empty((n, m), dt) for m in sizes[1:]]
        self._hidden = [(W, b, z) for (W, b), z in zip(ws[:-1], acts[:-1])]
        self._out = (*ws[-1], acts[-1])
        # backward, output layer first: (W, dW, db, A_prev^T or None for X, then for the
        # layer below: its upstream-gradient buffer, its activation A_prev, a scratch buffer)
        self._backward = []
        for i in reversed(range(len(ws))):
            below = (np.empty_like(acts[i - 1]), acts[i - 1], np.empty_like(acts[i - 1])) if i else None
            self._backward.append((ws[i][0], *gs[i], acts[i - 1].T if i else None, below))
        k = sizes[-1]
        self._rows = np.arange(n) * k  # flat index of row i's first logit
        self._zmax, self._sum = np.empty(n, dt), np.empty(n, dt)
        self._zmax_col, self._sum_col = self._zmax[:, None], self._sum[:, None]
        self._ones = np.ones(n, dt)
        self._lr_n = dt.type(lr / n)

    def _activate(self, z):
        if self.activation == "relu":
            np.maximum(z, 0, out=z)
        elif self.activation == "tanh":
            np.tanh(z, out=z)
        else:  # sigmoid(z) = (1 + tanh(z / 2)) / 2: never overflows
            z *= 0.5
            np.tanh(z, out=z)
            z *= 0.5
            z += 0.5

    def _derivative_times(self, g, a, tmp):
        """g <- g * sigma'(z), with sigma' written with the output a (coursekit.nn.activations)."""
        if self.activation == "relu":
            np.greater(a, 0, out=tmp)
        elif self.activation == "tanh":
            np.multiply(a, a, out=tmp)
            np.subtract(1, tmp, out=tmp)
        else:
            np.subtract(1, a, out=tmp)
            tmp *= a
        g *= tmp

    def __call__(self, X: np.ndarray, y: np.ndarray) -> float:
        """One SGD step on the batch (X, y); returns the mean loss before the update."""
        a = X
        for W, b, z in self._hidden:
            np.dot(a, W, out=z)
            z += b
            self._activate(z)
            a = z
        W, b, z = self._out
        np.dot(a, W, out=z)
        z += b
        # softmax + cross-entropy, fused, in z's buffer
        np.maximum.reduce(z, axis=1, out=self._zmax)
        z -= self._zmax_col
        flat = z.reshape(-1)
        target = self._rows + y
        picked = flat[target]  # z_{i, y_i} - max_j z_ij
        np.exp(z, out=z)
        np.add.reduce(z, axis=1, out=self._sum)
        loss = float(np.add.reduce(np.log(self._sum)) - np.add.reduce(picked)) / self.n
        np.divide(self._lr_n, self._sum, out=self._sum)
        z *= self._sum_col  # lr * softmax / n
        flat[target] -= self._lr_n  # delta^L, times lr
        delta = z
        for W, dW, db, a_prev_T, below in self._backward:
            np.dot(X.T if a_prev_T is None else a_prev_T, delta, out=dW)
            np.dot(self._ones, delta, out=db)
            if below is not None:
                g, a_prev, tmp = below
                np.dot(delta, W.T, out=g)
                self._derivative_times(g, a_prev, tmp)
                delta = g
        self.params -= self.buffer
        return loss


def training_steps(model: MLP, X, y, lr: float = 0.01, *, torch: bool = True) -> dict:
    """One SGD step on (X, y) per contestant, each on its own copy of ``model``'s weights.

    Returns, in this order, {"numba": coursekit's kernels (``loss_and_grad(out=, validate=False)``
    + ``SGD.step``), "numpy (tight)": :class:`TightNumpyStep`, "numpy (reference)": the
    readable :mod:`coursekit.nn.reference` + ``params -= lr * grad``, "pytorch": eager
    (when installed and ``torch``)}; each ``step()`` updates its copy in place. The attribute
    ``step.params`` (NumPy contestants) or ``step.net`` (PyTorch) exposes the copy, so tests
    can compare them. Only the softmax cross-entropy loss is supported here.
    """
    checks.boolean(torch, "torch")
    if model.loss != "softmax_xent":
        raise ValueError(f"training_steps compares softmax_xent models; got loss={model.loss!r}")
    X, y = model.check_batch(X, y)
    fast = model.copy()
    grad = np.empty_like(fast.params)
    opt = SGD(fast.params, lr)

    def numba_step():
        fast.loss_and_grad(X, y, out=grad, validate=False)
        opt.step(grad)

    tight = TightNumpyStep(model.params.copy(), model.sizes, model.activation, len(X), lr)

    def tight_step():
        tight(X, y)

    ref_params = model.params.copy()

    def reference_step():
        _, g = reference.loss_and_grad(ref_params, model.sizes, model.activation, model.loss, X, y)
        ref_params[...] -= model.dtype.type(lr) * g

    numba_step.params, tight_step.params, reference_step.params = fast.params, tight.params, ref_params
    steps = {"numba": numba_step, "numpy (tight)": tight_step, "numpy (reference)": reference_step}
    if torch and _torch_or_none() is not None:
        step, step.net = _torch_step(model, X, y, lr)
        steps["pytorch"] = step
    return steps
