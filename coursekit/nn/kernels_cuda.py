"""numba.cuda kernels for the MLP: a tiled shared-memory matrix product and fused
elementwise kernels, behind the same host functions as :mod:`coursekit.nn.kernels_cpu`.

Why a GPU wins on matrix products (lecture): thousands of simple cores and high memory
bandwidth. The tiled product shows the second half of the story: each block of
TPB x TPB threads loads one TPB x TPB tile of op(A) and of op(B) into fast shared
memory, then every thread does TPB multiply-adds from there, so each number read
from global memory is reused TPB times:

    C[i, j] = sum over tiles t of  sum_{k in tile t} opA[i, k] * opB[k, j]

with op(X) = X or X^T chosen per call, which gives the three products backprop needs:
A_prev W (forward), A_prev^T delta (dW) and delta W^T (upstream gradient).

The host functions take and return NumPy arrays (the flat buffer stays on the host,
where the later chapters allreduce it): parameters and the batch go to the device once
per call, every layer runs there, and the gradient comes back once.

Tests run these kernels with ``NUMBA_ENABLE_CUDASIM=1`` (numba's CUDA simulator runs
each GPU thread as a Python thread). There the tile is 4 x 4 instead of 16 x 16, so that
small test matrices still span several tiles and hit the partial-tile edges.
On a machine with several GPUs, call :func:`select_gpu` with the engine's local rank.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from typing import NamedTuple

import numba
import numpy as np
from numba import cuda

__all__ = [
    "TPB",
    "forward",
    "layer_backward",
    "layer_forward",
    "loss_and_grad_mse",
    "loss_and_grad_xent",
    "select_gpu",
]

#: tile width (threads per block along each axis)
TPB = 4 if numba.config.ENABLE_CUDASIM else 16


def select_gpu(local_rank: int) -> int:
    """Use GPU ``local_rank % n_gpus`` in this process (one GPU per engine); returns its id."""
    n = len(cuda.gpus)
    if n == 0:
        raise ValueError("select_gpu: numba finds no CUDA GPU in this process")
    gpu = int(local_rank) % n
    cuda.select_device(gpu)
    return gpu


@functools.lru_cache(maxsize=None)
def bind_engine_gpu() -> int | None:
    """On a coursekit cluster engine, use the GPU of its local rank (once); elsewhere None.

    Engines on one host get local ranks 0, 1, ... so engine i drives GPU i % n_gpus,
    like ``CUDA_VISIBLE_DEVICES=$LOCAL_RANK`` in a launcher script.
    """
    from coursekit.cluster import this_engine

    try:
        local_rank = this_engine().local_rank
    except RuntimeError:  # not on an engine
        return None
    return select_gpu(local_rank)


class _Kernels(NamedTuple):
    matmul: object
    bias_act: object
    delta: object
    column_sums: object
    softmax_xent: object
    mse: object


@functools.lru_cache(maxsize=None)
def _kernels(dtype: np.dtype) -> _Kernels:
    """Compile the kernels for one dtype (shared arrays and accumulators need it fixed)."""
    t = numba.from_dtype(dtype)

    @cuda.jit
    def matmul(A, B, C, trans_a, trans_b):
        """C = op(A) @ op(B), op(X) = X.T when trans_x; tiles of TPB x TPB in shared memory."""
        sA = cuda.shared.array((TPB, TPB), dtype=t)
        sB = cuda.shared.array((TPB, TPB), dtype=t)
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        i = cuda.blockIdx.y * TPB + ty  # row of C
        j = cuda.blockIdx.x * TPB + tx  # column of C
        M, N = C.shape
        K = A.shape[0] if trans_a else A.shape[1]
        acc = t(0)
        for tile in range((K + TPB - 1) // TPB):
            k = tile * TPB + tx
            if i < M and k < K:
                sA[ty, tx] = A[k, i] if trans_a else A[i, k]
            else:
                sA[ty, tx] = 0
            k = tile * TPB + ty
            if j < N and k < K:
                sB[ty, tx] = B[j, k] if trans_b else B[k, j]
            else:
                sB[ty, tx] = 0
            cuda.syncthreads()
            for kk in range(TPB):
                acc += sA[ty, kk] * sB[kk, tx]
            cuda.syncthreads()
        if i < M and j < N:
            C[i, j] = acc

    @cuda.jit
    def bias_act(Z, b, act):
        """Z <- sigma(Z + b), one thread per element."""
        j, i = cuda.grid(2)
        if i < Z.shape[0] and j < Z.shape[1]:
            z = Z[i, j] + b[j]
            if act == 1:
                z = max(z, t(0))
            elif act == 2:
                if z >= 0:
                    z = 1 / (1 + math.exp(-z))
                else:
                    e = math.exp(z)
                    z = e / (1 + e)
            elif act == 3:
                z = math.tanh(z)
            Z[i, j] = z

    @cuda.jit
    def delta(G, A, act):
        """G <- G * sigma'(A), sigma' written with the output A."""
        j, i = cuda.grid(2)
        if i < G.shape[0] and j < G.shape[1]:
            a = A[i, j]
            if act == 1:
                if a <= 0:
                    G[i, j] = 0
            elif act == 2:
                G[i, j] *= a * (1 - a)
            elif act == 3:
                G[i, j] *= 1 - a * a

    @cuda.jit
    def column_sums(G, db):
        """db[j] = sum_i G[i, j], one thread per column."""
        j = cuda.grid(1)
        if j < G.shape[1]:
            s = t(0)
            for i in range(G.shape[0]):
                s += G[i, j]
            db[j] = s

    @cuda.jit
    def softmax_xent(Z, y, row_loss):
        """Per row: loss_i = log sum exp(z) - z_y; Z <- (softmax(Z) - onehot(y)) / n."""
        i = cuda.grid(1)
        n, m = Z.shape
        if i < n:
            zmax = Z[i, 0]
            for j in range(1, m):
                zmax = max(zmax, Z[i, j])
            shifted_target = Z[i, y[i]] - zmax
            s = t(0)
            for j in range(m):
                e = math.exp(Z[i, j] - zmax)
                Z[i, j] = e
                s += e
            row_loss[i] = math.log(s) - shifted_target
            for j in range(m):
                Z[i, j] = Z[i, j] / (s * n)
            Z[i, y[i]] -= t(1) / n

    @cuda.jit
    def mse(Z, T, row_loss):
        """Per row: loss_i = (1/2) ||z_i - t_i||^2; Z <- (Z - T) / n."""
        i = cuda.grid(1)
        n, m = Z.shape
        if i < n:
            s = t(0)
            for j in range(m):
                d = Z[i, j] - T[i, j]
                s += d * d
                Z[i, j] = d / n
            row_loss[i] = s / 2

    return _Kernels(matmul, bias_act, delta, column_sums, softmax_xent, mse)


def _grid2(rows: int, cols: int):
    return (math.ceil(cols / TPB), math.ceil(rows / TPB)), (TPB, TPB)


def _grid1(n: int):
    threads = TPB * TPB
    return math.ceil(n / threads), threads


def _matmul(A, B, trans_a, trans_b, out=None):
    """op(A) @ op(B) on the device (into ``out`` when given)."""
    M = A.shape[1] if trans_a else A.shape[0]
    N = B.shape[0] if trans_b else B.shape[1]
    if out is None:
        out = cuda.device_array((M, N), dtype=A.dtype)
    blocks, threads = _grid2(M, N)
    _kernels(A.dtype).matmul[blocks, threads](A, B, out, trans_a, trans_b)
    return out


def _d_layer_forward(W, b, A_prev, act):
    Z = _matmul(A_prev, W, False, False)
    blocks, threads = _grid2(*Z.shape)
    _kernels(Z.dtype).bias_act[blocks, threads](Z, b, act)
    return Z


def _d_layer_backward(W, A_prev, A, G, act, dW, db, input_grad: bool):
    k = _kernels(G.dtype)
    blocks, threads = _grid2(*G.shape)
    k.delta[blocks, threads](G, A, act)
    _matmul(A_prev, G, True, False, out=dW)
    blocks, threads = _grid1(G.shape[1])
    k.column_sums[blocks, threads](G, db)
    return _matmul(G, W, False, True) if input_grad else None


def _d_views(flat, sizes, layer):
    start = sum(int(sizes[i + 1]) * (int(sizes[i]) + 1) for i in range(layer))
    n_in, n_out = int(sizes[layer]), int(sizes[layer + 1])
    w_stop = start + n_out * n_in
    return flat[start:w_stop].reshape((n_in, n_out)), flat[w_stop : w_stop + n_out]


def _d_forward_all(d_params, sizes, act, d_X):
    n_layers = len(sizes) - 1
    acts = [d_X]
    for layer in range(n_layers):
        W, b = _d_views(d_params, sizes, layer)
        acts.append(_d_layer_forward(W, b, acts[-1], act if layer < n_layers - 1 else 0))
    return acts


# Numba's simulator runs one kernel at a time, and while it runs it replaces this module's
# global ``cuda`` by a fake one (``swapped_cuda_module``): a second Python thread that
# launches a kernel fails ("concurrent simulated kernel not supported") or calls
# ``cuda.to_device`` on the fake. In-process ranks (ThreadComm threads) therefore take
# turns here under the simulator; on a GPU the threads launch freely.
_turns = threading.RLock() if numba.config.ENABLE_CUDASIM else contextlib.nullcontext()


def _one_at_a_time_in_simulator(fn):
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with _turns:
            return fn(*args, **kwargs)
    return wrapper


@_one_at_a_time_in_simulator
def layer_forward(W, b, A_prev, act, out):
    """Host arrays in, ``out`` <- sigma(A_prev W + b) (as kernels_cpu.layer_forward)."""
    d = _d_layer_forward(cuda.to_device(W), cuda.to_device(b), cuda.to_device(A_prev), act)
    d.copy_to_host(out)
    return out


@_one_at_a_time_in_simulator
def layer_backward(W, A_prev, A, G, act, dW, db, G_prev):
    """As kernels_cpu.layer_backward: G <- delta, dW, db, and G_prev unless it has 0 rows."""
    dG = cuda.to_device(G)
    d_dW, d_db = cuda.device_array(dW.shape, dW.dtype), cuda.device_array(db.shape, db.dtype)
    d_prev = _d_layer_backward(
        cuda.to_device(W), cuda.to_device(A_prev), cuda.to_device(A), dG, act, d_dW, d_db, G_prev.shape[0] > 0
    )
    dG.copy_to_host(G)
    d_dW.copy_to_host(dW)
    d_db.copy_to_host(db)
    if d_prev is not None:
        d_prev.copy_to_host(G_prev)


@_one_at_a_time_in_simulator
def forward(params, sizes, act, X):
    """The network's output A^L, computed on the GPU, returned on the host."""
    return _d_forward_all(cuda.to_device(params), sizes, act, cuda.to_device(X))[-1].copy_to_host()


# -- one training step in three parts, so that a caller can time them apart -------------
#    t_step = t_stage_in + t_compute + t_stage_out   (MLP.loss_and_grad(..., timer=...))

class Staged(NamedTuple):
    """One mini-batch's device arrays: inputs copied in, outputs allocated (not yet filled)."""

    params: object
    X: object
    target: object
    grad: object
    row_loss: object


@_one_at_a_time_in_simulator
def stage_in(params, X, target) -> Staged:
    """Host -> device: the parameters (4 or 8 bytes each), the batch X and its labels or
    targets: bytes = params.nbytes + X.nbytes + target.nbytes; plus room for the gradient
    and the per-row losses."""
    return Staged(cuda.to_device(params), cuda.to_device(X), cuda.to_device(target),
                  cuda.device_array(params.shape, params.dtype),
                  cuda.device_array(len(X), np.float64))


@_one_at_a_time_in_simulator
def compute(staged: Staged, loss: str, sizes, act) -> None:
    """Forward + ``loss`` ("softmax_xent" or "mse") + backward on the device, into
    ``staged.grad`` and ``staged.row_loss``; returns after ``cuda.synchronize()``, so the
    time of this call is the kernels' (launches are asynchronous)."""
    d_params, n_layers = staged.params, len(sizes) - 1
    k = _kernels(d_params.dtype)
    acts = _d_forward_all(d_params, sizes, act, staged.X)
    G = acts[-1]
    blocks, threads = _grid1(len(G))
    (k.softmax_xent if loss == "softmax_xent" else k.mse)[blocks, threads](
        G, staged.target, staged.row_loss)
    for layer in range(n_layers - 1, -1, -1):
        W, _ = _d_views(d_params, sizes, layer)
        dW, db = _d_views(staged.grad, sizes, layer)
        G = _d_layer_backward(
            W, acts[layer], acts[layer + 1], G, act if layer < n_layers - 1 else 0, dW, db, layer > 0
        )
    cuda.synchronize()


@_one_at_a_time_in_simulator
def stage_out(staged: Staged, grad) -> float:
    """Device -> host: the gradient into ``grad`` (grad.nbytes) and the mean loss (the
    per-row losses, 8 bytes a row, summed on the host)."""
    staged.grad.copy_to_host(grad)
    row_loss = staged.row_loss.copy_to_host()
    return float(row_loss.sum() / len(row_loss))


def _loss_and_grad(loss, params, grad, sizes, act, X, target):
    staged = stage_in(params, X, target)
    compute(staged, loss, sizes, act)
    return stage_out(staged, grad)


def loss_and_grad_xent(params, grad, sizes, act, X, y):
    """As kernels_cpu.loss_and_grad_xent, on the GPU: :func:`stage_in`, :func:`compute`,
    :func:`stage_out`."""
    return _loss_and_grad("softmax_xent", params, grad, sizes, act, X, y)


def loss_and_grad_mse(params, grad, sizes, act, X, T):
    """As kernels_cpu.loss_and_grad_mse, on the GPU (see :func:`loss_and_grad_xent`)."""
    return _loss_and_grad("mse", params, grad, sizes, act, X, T)
