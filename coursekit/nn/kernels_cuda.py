"""numba.cuda kernels for the MLP: a register-blocked tiled matrix product with a fused
bias + activation epilogue, and elementwise kernels, behind the same host functions as
:mod:`coursekit.nn.kernels_cpu`.

Why a GPU wins on matrix products (lecture): thousands of simple cores and high memory
bandwidth. The tiled product shows the second half of the story. A block of
TY x TX threads computes one BM x BN tile of C; each step it stages a BM x BK slab of op(A)
and a BK x BN slab of op(B) in fast shared memory, and each thread keeps an RM x RN
sub-tile of C in registers (``cuda.local.array``), so per shared-memory number it reads it
does RM (or RN) multiply-adds. Each number read from global memory is reused TILE times,
BN times for op(A) and BM times for op(B):

    C[i, j] = sum over slabs s of  sum_{k in slab s} opA[i, k] * opB[k, j]
    global loads = M K (N / BN) + K N (M / BM)   vs   2 M N K for one output per thread

with op(X) = X or X^T chosen per call, which gives the three products backprop needs:
A_prev W (forward), A_prev^T delta (dW) and delta W^T (upstream gradient). The forward's
epilogue applies sigma(. + b) before the one store. When M x N has too few tiles to fill
the GPU (the 10-wide output layer), K is split into ``splits`` slabs run by separate blocks
(split-K); their partial sums, kept in the accumulator type, are added (then bias and
activation) by a second kernel.

Storage and accumulation types: float64 computes in float64; float32 and float16 storage
both accumulate in float32 registers, converting on load and rounding once on store
(how a 16-bit GEMM runs on a GPU; :func:`loss_and_grad_mixed` uses it for chapter 8's
mixed precision).

The host functions take and return NumPy arrays (the flat buffer stays on the host,
where the later chapters allreduce it): parameters and the batch go to the device once
per call, every layer runs there, and the gradient comes back once. The training step
(:func:`stage_in`, :func:`compute`, :func:`stage_out`) copies into device buffers that each
thread allocates once per step shape and reuses (:func:`_step_buffers`), since a numba
allocation costs more CPU time than a small step's kernels.

Tests run these kernels with ``NUMBA_ENABLE_CUDASIM=1`` (numba's CUDA simulator runs
each GPU thread as a Python thread). There the tile is 8 x 8 (4 x 4 threads of 2 x 2
outputs, slabs of 4) instead of 64 x 64, so that small test matrices still span several
tiles and hit the partial-tile edges.
On a machine with several GPUs, call :func:`select_gpu` with the engine's local rank.
"""

from __future__ import annotations

import contextlib
import functools
import math
import threading
from collections import OrderedDict
from typing import NamedTuple

import numba
import numpy as np
from numba import cuda

if not hasattr(np, "row_stack"):
    # NumPy 2.5 removed np.row_stack (an alias of np.vstack) and numba-cuda releases up to at
    # least the one on the course's GPU machines (numba 0.68.0 + numba-cuda, numpy 2.5.2)
    # still register an overload for it when they compile the first kernel, so every kernel
    # failed with "module 'numpy' has no attribute 'row_stack'". Restore the alias.
    np.row_stack = np.vstack

__all__ = [
    "TILE",
    "TPB",
    "MixedStep",
    "STEP_CACHE_SIZE",
    "Tile",
    "forward",
    "layer_backward",
    "layer_forward",
    "loss_and_grad_mixed",
    "loss_and_grad_mse",
    "loss_and_grad_xent",
    "select_gpu",
]

_SIM = bool(numba.config.ENABLE_CUDASIM)

#: threads per block along each axis of the elementwise kernels
TPB = 4 if _SIM else 16


class Tile(NamedTuple):
    """The matrix product's blocking: a block computes BM x BN of C with (BM/RM) x (BN/RN)
    threads, each RM x RN outputs in registers, over K in slabs of BK."""

    BM: int
    BN: int
    BK: int
    RM: int
    RN: int

    @property
    def threads(self) -> tuple[int, int]:
        return self.BN // self.RN, self.BM // self.RM  # (x: columns, y: rows)

    def check(self) -> "Tile":
        tx, ty = self.threads
        n = tx * ty
        if (self.BM % self.RM or self.BN % self.RN or (self.BM * self.BK) % n
                or (self.BK * self.BN) % n or n > 1024):
            raise ValueError(f"{self}: RM, RN must divide BM, BN and the threads "
                             f"({n}, at most 1024) must divide BM*BK and BK*BN")
        return self


#: the default blocking (a 64 x 64 tile, 16 x 16 threads of 4 x 4); 8 x 8 in the simulator
TILE = Tile(8, 8, 4, 2, 2) if _SIM else Tile(64, 64, 16, 4, 4)
#: split K only while each split still has this many slabs of BK
_MIN_SLABS_PER_SPLIT = 4


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


def _acc_dtype(dtype) -> np.dtype:
    """The accumulator type for a storage type: float64 stays, float32 and float16 -> float32."""
    return np.dtype(np.float64) if np.dtype(dtype) == np.float64 else np.dtype(np.float32)


class _Kernels(NamedTuple):
    activate: object
    splitk_reduce: object
    delta: object
    column_sums: object
    softmax_xent: object
    mse: object
    softmax_xent_scaled: object
    mse_scaled: object
    absmax_rows: object


def _kernels(dtype) -> _Kernels:
    """The kernels for storage type ``dtype`` (compiled once per accumulator type; numba
    specializes each for the argument types it is called with, float16 included)."""
    return _compile(_acc_dtype(dtype))


@functools.lru_cache(maxsize=None)
def _matmul_kernel(acc_dtype: np.dtype, tile: Tile, trans_a: bool, trans_b: bool):
    """C (or split-K partials) = op(A) @ op(B), accumulated in ``acc_dtype`` with ``tile``
    (the transposes are compile-time constants: each of the four products has its own
    loaders, with no branch in the loop)."""
    t = numba.from_dtype(acc_dtype)
    BM, BN, BK, RM, RN = tile.check()
    TX, TY = tile.threads
    NT = TX * TY
    LOADS_A, LOADS_B = BM * BK // NT, BK * BN // NT
    SA_COLS, SB_COLS = BM + 1, BN + 1  # +1: transposed stores hit distinct banks (constants here:
    # a shared array's shape must be known when the kernel compiles)
    activate = _compile(acc_dtype).activate
    TA, TB = bool(trans_a), bool(trans_b)

    @cuda.jit
    def matmul(A, B, C, bias, act, k_len):
        """op(A) @ op(B), op(X) = X.T when TA / TB. Block (bx, by, z) computes the BM x BN
        tile (by, bx) of C over K-range [z k_len, (z+1) k_len). With one split (gridDim.z
        == 1) and act >= 0 it stores sigma_act(. + bias); otherwise the plain sum, split z
        into rows z*M .. z*M + M - 1 of C (the partials)."""
        sA = cuda.shared.array((BK, SA_COLS), dtype=t)
        sB = cuda.shared.array((BK, SB_COLS), dtype=t)
        acc = cuda.local.array((RM, RN), dtype=t)
        a = cuda.local.array(RM, dtype=t)
        b = cuda.local.array(RN, dtype=t)
        tx, ty = cuda.threadIdx.x, cuda.threadIdx.y
        tid = ty * TX + tx
        i0 = cuda.blockIdx.y * BM
        j0 = cuda.blockIdx.x * BN
        M = A.shape[1] if TA else A.shape[0]
        K = A.shape[0] if TA else A.shape[1]
        N = B.shape[0] if TB else B.shape[1]
        k_begin = cuda.blockIdx.z * k_len
        k_end = min(K, k_begin + k_len)
        for r in range(RM):
            for c in range(RN):
                acc[r, c] = 0
        for k0 in range(k_begin, k_end, BK):
            for l in range(LOADS_A):  # slab of op(A): BM rows x BK, coalesced along memory
                e = tid + l * NT
                if TA:  # A is K x M: consecutive threads read consecutive i
                    r, kk = e % BM, e // BM
                else:  # A is M x K: consecutive threads read consecutive k
                    r, kk = e // BK, e % BK
                i, k = i0 + r, k0 + kk
                if i < M and k < k_end:
                    sA[kk, r] = t(A[k, i]) if TA else t(A[i, k])
                else:
                    sA[kk, r] = 0
            for l in range(LOADS_B):  # slab of op(B): BK x BN columns
                e = tid + l * NT
                if TB:  # B is N x K
                    kk, c = e % BK, e // BK
                else:  # B is K x N
                    kk, c = e // BN, e % BN
                j, k = j0 + c, k0 + kk
                if j < N and k < k_end:
                    sB[kk, c] = t(B[j, k]) if TB else t(B[k, j])
                else:
                    sB[kk, c] = 0
            cuda.syncthreads()
            for kk in range(BK):
                for r in range(RM):
                    a[r] = sA[kk, ty + TY * r]
                for c in range(RN):
                    b[c] = sB[kk, tx + TX * c]
                for r in range(RM):
                    for c in range(RN):
                        acc[r, c] += a[r] * b[c]
            cuda.syncthreads()
        fuse = act >= 0  # (the host passes act = -1 to split-K partials)
        row0 = cuda.blockIdx.z * M
        for r in range(RM):
            i = i0 + ty + TY * r
            if i < M:
                for c in range(RN):
                    j = j0 + tx + TX * c
                    if j < N:
                        if fuse:
                            C[i, j] = activate(acc[r, c] + t(bias[j]), act)
                        else:
                            C[row0 + i, j] = acc[r, c]

    return matmul


@functools.lru_cache(maxsize=None)
def _compile(acc_dtype: np.dtype) -> _Kernels:
    """Compile the elementwise kernels for one accumulator type (their registers need it)."""
    t = numba.from_dtype(acc_dtype)
    one, zero = t(1), t(0)

    @cuda.jit(device=True)
    def activate(z, act):
        """sigma_act(z): 0 identity, 1 relu, 2 sigmoid, 3 tanh."""
        if act == 1:
            return max(z, zero)
        if act == 2:
            if z >= zero:
                return one / (one + math.exp(-z))
            e = math.exp(z)
            return e / (one + e)
        if act == 3:
            return math.tanh(z)
        return z

    @cuda.jit
    def splitk_reduce(P, splits, C, bias, act):
        """C = sigma_act(sum_z P[z M + i, j] + bias[j]) (just the sum when act < 0)."""
        j, i = cuda.grid(2)
        M, N = C.shape
        if i < M and j < N:
            s = zero
            for z in range(splits):
                s += P[z * M + i, j]
            if act >= 0:
                s = activate(s + t(bias[j]), act)
            C[i, j] = s

    @cuda.jit
    def delta(G, A, act, D):
        """D <- G * sigma'(A), sigma' written with the output A (D may be G itself)."""
        j, i = cuda.grid(2)
        if i < G.shape[0] and j < G.shape[1]:
            a, g = t(A[i, j]), t(G[i, j])
            if act == 1:
                if a <= zero:
                    g = zero
            elif act == 2:
                g *= a * (one - a)
            elif act == 3:
                g *= one - a * a
            D[i, j] = g

    @cuda.jit
    def column_sums(G, db):
        """db[j] = sum_i G[i, j], one thread per column."""
        j = cuda.grid(1)
        if j < G.shape[1]:
            s = zero
            for i in range(G.shape[0]):
                s += t(G[i, j])
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
            s = zero
            for j in range(m):
                e = math.exp(Z[i, j] - zmax)
                Z[i, j] = e
                s += e
            row_loss[i] = math.log(s) - shifted_target
            for j in range(m):
                Z[i, j] = Z[i, j] / (s * n)
            Z[i, y[i]] -= one / n

    @cuda.jit
    def mse(Z, T, row_loss):
        """Per row: loss_i = (1/2) ||z_i - t_i||^2; Z <- (Z - T) / n."""
        i = cuda.grid(1)
        n, m = Z.shape
        if i < n:
            s = zero
            for j in range(m):
                d = Z[i, j] - T[i, j]
                s += d * d
                Z[i, j] = d / n
            row_loss[i] = s / 2

    @cuda.jit
    def softmax_xent_scaled(Z, y, row_loss, G, scale):
        """As softmax_xent, Z read-only (any float type, computed in the accumulator's):
        G <- scale (softmax(Z) - onehot(y)) / n, rounded once to G's type."""
        i = cuda.grid(1)
        n, m = Z.shape
        if i < n:
            zmax = t(Z[i, 0])
            for j in range(1, m):
                zmax = max(zmax, t(Z[i, j]))
            s = zero
            for j in range(m):
                s += math.exp(t(Z[i, j]) - zmax)
            row_loss[i] = math.log(s) - (t(Z[i, y[i]]) - zmax)
            for j in range(m):
                p = math.exp(t(Z[i, j]) - zmax) / s
                if j == y[i]:
                    p -= one
                G[i, j] = p / t(n) * scale

    @cuda.jit
    def mse_scaled(Z, T, row_loss, G, scale):
        """As mse, Z read-only: G <- scale (Z - T) / n, rounded once to G's type."""
        i = cuda.grid(1)
        n, m = Z.shape
        if i < n:
            s = zero
            for j in range(m):
                d = t(Z[i, j]) - t(T[i, j])
                s += d * d
                G[i, j] = d / t(n) * scale
            row_loss[i] = s / 2

    @cuda.jit
    def absmax_rows(G, out, offset):
        """out[offset + i] = max_j |G[i, j]|, inf when the row holds an inf or a NaN."""
        i = cuda.grid(1)
        if i < G.shape[0]:
            m = zero
            for j in range(G.shape[1]):
                g = abs(t(G[i, j]))
                if not g <= m:  # g > m, or g is NaN
                    m = g if g == g else t(math.inf)
            out[offset + i] = m

    return _Kernels(activate, splitk_reduce, delta, column_sums, softmax_xent, mse,
                    softmax_xent_scaled, mse_scaled, absmax_rows)


def _grid2(rows: int, cols: int):
    return (math.ceil(cols / TPB), math.ceil(rows / TPB)), (TPB, TPB)


def _grid1(n: int):
    threads = TPB * TPB
    return math.ceil(n / threads), threads


@functools.lru_cache(maxsize=None)
def _n_sm() -> int:
    """Streaming multiprocessors of the current GPU (8 in the simulator, so that the tests'
    small products get split along K too)."""
    if _SIM:
        return 8
    return int(cuda.get_current_device().MULTIPROCESSOR_COUNT)


def _splits(M: int, N: int, K: int, tile: Tile) -> int:
    """How many K-splits: none when the tiles fill every SM, else enough for two blocks per
    SM, each split still >= 4 slabs of BK."""
    tiles = math.ceil(M / tile.BM) * math.ceil(N / tile.BN)
    if tiles >= _n_sm():
        return 1
    want = math.ceil(2 * _n_sm() / tiles)
    return max(1, min(want, K // (_MIN_SLABS_PER_SPLIT * tile.BK)))


_NO_BIAS: dict = {}
_THIS_THREAD = threading.local()


def _workspace(shape, dtype):
    """A device buffer for split-K partials, reused across calls (kernels on one stream run in
    order, so the reduce has read it before the next product writes it): no allocation a call.

    One per thread: ranks that are threads of one process (ThreadComm) share the GPU's
    stream, and with one shared buffer a rank's product could overwrite another's partials
    between its two kernels (seen once on an H200: 2 thread ranks of float32 data-parallel
    SGD left the CPU's parameters)."""
    buffers = getattr(_THIS_THREAD, "workspace", None)
    if buffers is None:
        buffers = _THIS_THREAD.workspace = {}
    key = (np.dtype(dtype), _device_id())
    size = int(np.prod(shape))
    buf = buffers.get(key)
    if buf is None or buf.size < size:
        buf = buffers[key] = cuda.device_array(max(size, 1 << 16), dtype=dtype)
    return buf[:size].reshape(shape)


def _device_id() -> int:
    return 0 if _SIM else cuda.get_current_device().id


def _no_bias(dtype):
    key = (np.dtype(dtype), _device_id())
    if key not in _NO_BIAS:
        _NO_BIAS[key] = cuda.to_device(np.zeros(1, dtype))
    return _NO_BIAS[key]


def _matmul(A, B, trans_a, trans_b, out=None, *, bias=None, act=-1, dtype=None, splits=None,
            tile=None):
    """op(A) @ op(B) on the device (into ``out`` when given, else a new array of ``dtype``,
    default B's), then sigma_act(. + bias) when ``act`` >= 0 (0 identity, 1 relu, 2
    sigmoid, 3 tanh). ``splits`` (K-splits) and ``tile`` default to what fits the shape."""
    tile = TILE if tile is None else tile
    M = A.shape[1] if trans_a else A.shape[0]
    K = A.shape[0] if trans_a else A.shape[1]
    N = B.shape[0] if trans_b else B.shape[1]
    if (B.shape[1] if trans_b else B.shape[0]) != K:
        raise ValueError(f"_matmul: op(A) is {M} x {K} but op(B) is "
                         f"{B.shape[1] if trans_b else B.shape[0]} x {N}")
    if out is None:
        out = cuda.device_array((M, N), dtype=B.dtype if dtype is None else dtype)
    acc = _acc_dtype(out.dtype)
    if bias is None:
        bias = _no_bias(acc)
    splits = _splits(M, N, K, tile) if splits is None else max(1, min(int(splits), K))
    k_len = math.ceil(math.ceil(K / splits) / tile.BK) * tile.BK  # whole slabs per split
    splits = math.ceil(K / k_len)
    blocks = (math.ceil(N / tile.BN), math.ceil(M / tile.BM), splits)
    kernel = _matmul_kernel(acc, tile, bool(trans_a), bool(trans_b))
    if splits == 1:
        kernel[blocks, tile.threads](A, B, out, bias, act, k_len)
        return out
    partial = _workspace((splits * M, N), acc)
    kernel[blocks, tile.threads](A, B, partial, bias, -1, k_len)
    g_blocks, g_threads = _grid2(M, N)
    _compile(acc).splitk_reduce[g_blocks, g_threads](partial, splits, out, bias, act)
    return out


def _d_layer_forward(W, b, A_prev, act, out=None):
    """sigma(A_prev W + b): one matrix product with the bias and activation in its epilogue
    (into ``out`` when given)."""
    return _matmul(A_prev, W, False, False, out=out, bias=b, act=act)


def _d_layer_backward(W, A_prev, A, G, act, dW, db, input_grad: bool, D=None, G_prev=None):
    """delta = G sigma'(A) into D (default: G itself), dW = A_prev^T delta, db = column sums,
    and, if ``input_grad``, returns delta W^T (into ``G_prev`` when given; in G's type: mixed
    precision keeps delta in float32 in D and rounds the products once, to dW's and G's
    16-bit types)."""
    k = _kernels(G.dtype)
    D = G if D is None else D
    blocks, threads = _grid2(*G.shape)
    k.delta[blocks, threads](G, A, act, D)
    _matmul(A_prev, D, True, False, out=dW)
    blocks, threads = _grid1(G.shape[1])
    k.column_sums[blocks, threads](D, db)
    return _matmul(D, W, False, True, out=G_prev, dtype=G.dtype) if input_grad else None


def _d_views(flat, sizes, layer):
    start = sum(int(sizes[i + 1]) * (int(sizes[i]) + 1) for i in range(layer))
    n_in, n_out = int(sizes[layer]), int(sizes[layer + 1])
    w_stop = start + n_out * n_in
    return flat[start:w_stop].reshape((n_in, n_out)), flat[w_stop : w_stop + n_out]


def _d_forward_all(d_params, sizes, act, d_X, outs=()):
    """[A^0 = d_X, A^1, ..., A^L], A^l into ``outs[l - 1]`` when given (else allocated)."""
    n_layers = len(sizes) - 1
    outs = outs or [None] * n_layers
    acts = [d_X]
    for layer in range(n_layers):
        W, b = _d_views(d_params, sizes, layer)
        acts.append(_d_layer_forward(W, b, acts[-1], act if layer < n_layers - 1 else 0,
                                     out=outs[layer]))
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


class MixedStep(NamedTuple):
    """What :func:`loss_and_grad_mixed` returns: the mean loss (unweighted, fp32 math), the
    largest |value| of the scaled 16-bit activation gradients G^L .. G^1 (inf if one
    overflowed), and the step's device arrays A^0 .. A^L and G^1 .. G^L (16-bit, kept on
    the GPU: ``.copy_to_host()`` to inspect them)."""

    loss: float
    peak: float
    activations: list
    activation_grads: list


def _check_mixed_storage(*arrays) -> np.dtype:
    dt = arrays[0].dtype
    if dt not in (np.float16, np.float32) or any(a.dtype != dt for a in arrays):
        raise ValueError("loss_and_grad_mixed: weights16, grad16 and X16 must all be float16 "
                         "(or all float32, fmt='fp32'); got "
                         + ", ".join(str(a.dtype) for a in arrays))
    return dt


@_one_at_a_time_in_simulator
def loss_and_grad_mixed(weights16, grad16, sizes, act, X16, target, *, loss: str = "softmax_xent",
                        scale: float = 1.0) -> MixedStep:
    """One mixed-precision step on the GPU (chapter 8; the equations of
    :mod:`coursekit.nn.mixed_precision`, run as real 16-bit kernels).

    ``weights16`` (the flat buffer rounded to float16), ``X16`` (A^0) and ``grad16`` (out:
    the scaled 16-bit gradient) are float16 host arrays (float32 for fmt="fp32"); ``target``
    holds int64 labels ("softmax_xent") or float targets ("mse"). Every matrix product reads
    16-bit inputs, accumulates in float32 and rounds once when it stores; the loss and
    G^L = round(scale * dC/dZ^L) are computed in float32; delta^l = G^l sigma'(A^l) stays in
    float32 (as the emulation's fused delta). Uploads the 16-bit weights and batch, returns
    only grad16 (and the loss and peak); activations stay on the device.
    """
    storage = _check_mixed_storage(weights16, grad16, X16)
    if loss not in ("softmax_xent", "mse"):
        raise ValueError(f"loss={loss!r} is not supported; allowed: softmax_xent, mse")
    k = _kernels(storage)
    n_layers, n = len(sizes) - 1, len(X16)
    d_params = cuda.to_device(weights16)
    d_grad = cuda.device_array(grad16.shape, storage)
    acts = _d_forward_all(d_params, sizes, act, cuda.to_device(X16))
    G = cuda.device_array(acts[-1].shape, storage)
    row_loss = cuda.device_array(n, np.float64)
    peaks = cuda.device_array(n_layers * n, np.float32)
    blocks, threads = _grid1(n)
    loss_kernel = k.softmax_xent_scaled if loss == "softmax_xent" else k.mse_scaled
    loss_kernel[blocks, threads](acts[-1], cuda.to_device(target), row_loss, G, np.float32(scale))
    grads = [G]
    D = None  # delta^l in float32 (G^l itself stays, for inspection)
    for layer in range(n_layers - 1, -1, -1):
        k.absmax_rows[blocks, threads](G, peaks, (n_layers - 1 - layer) * n)
        W, _ = _d_views(d_params, sizes, layer)
        dW, db = _d_views(d_grad, sizes, layer)
        if D is None or D.shape != G.shape:
            D = cuda.device_array(G.shape, np.float32)
        G = _d_layer_backward(W, acts[layer], acts[layer + 1], G, act if layer < n_layers - 1 else 0,
                              dW, db, layer > 0, D=D)
        if G is not None:
            grads.insert(0, G)
    d_grad.copy_to_host(grad16)
    loss_value = float(row_loss.copy_to_host().sum() / n)
    return MixedStep(loss_value, float(peaks.copy_to_host().max()), acts, grads)


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
    """One mini-batch's device arrays: inputs copied in, outputs and the step's
    intermediates (not yet filled). ``acts``: A^1 .. A^L (A^L becomes G^L in place: the
    loss kernel overwrites it); ``input_grads``: G^1 .. G^(L-1), the gradients that flow
    down into the hidden layers (empty tuples: :func:`compute` allocates them)."""

    params: object
    X: object
    target: object
    grad: object
    row_loss: object
    acts: tuple = ()
    input_grads: tuple = ()


#: step shapes each thread keeps device buffers for, newest first (a sweep over batch sizes
#: frees the oldest instead of holding every shape's buffers)
STEP_CACHE_SIZE = 4


def _step_buffers(params, X, target, sizes) -> Staged:
    """This thread's device buffers for a step of this shape: allocated on first use, then
    reused, so a steady-state step allocates nothing on the device.

    Cost model of a step, from the H200 measurements (bench/README.md):

        t_step ~ n_launch * t_launch + n_alloc * t_alloc + bytes / bandwidth

    with t_launch ~ 40-65 us and t_alloc ~ 100-140 us of CPU per numba call. Allocating
    parameters, gradient, batch, targets, row losses and every layer's A^l and G^l afresh
    made n_alloc = 2L + 4 a step for L layers (5 staged arrays, L activations, L - 1
    gradients; the split-K workspace was already reused); here they are cached per
    (device, dtypes, layer sizes, batch shape), so n_alloc = 0 from the second step of a
    shape on: the host -> device copies go into the cached buffers (``copy_to_device``),
    which leaves the launches and the bytes. Their contents never carry over: every step
    overwrites params, X and target, and every kernel writes its whole output.

    One cache per thread, like :func:`_workspace`: thread ranks (ThreadComm) share the
    GPU's stream, and two ranks staging into one buffer would overwrite each other's batch.
    It keeps the :data:`STEP_CACHE_SIZE` most recently used shapes. Within a thread, the
    arrays of a :class:`Staged` stay valid until the next :func:`stage_in` of the same
    shape."""
    cache = getattr(_THIS_THREAD, "steps", None)
    if cache is None:
        cache = _THIS_THREAD.steps = OrderedDict()
    sizes = tuple(int(s) for s in sizes)
    key = (_device_id(), params.dtype, params.shape, sizes, X.dtype, X.shape,
           target.dtype, target.shape)
    staged = cache.get(key)
    if staged is not None:
        cache.move_to_end(key)
        return staged
    n = len(X)
    staged = cache[key] = Staged(
        cuda.device_array(params.shape, params.dtype), cuda.device_array(X.shape, X.dtype),
        cuda.device_array(target.shape, target.dtype),
        cuda.device_array(params.shape, params.dtype), cuda.device_array(n, np.float64),
        tuple(cuda.device_array((n, m), params.dtype) for m in sizes[1:]),
        tuple(cuda.device_array((n, m), params.dtype) for m in sizes[1:-1]))
    while len(cache) > STEP_CACHE_SIZE:
        cache.popitem(last=False)  # the least recently used shape; numba frees it
    return staged


@_one_at_a_time_in_simulator
def stage_in(params, X, target, sizes) -> Staged:
    """Host -> device: the parameters (4 or 8 bytes each), the batch X and its labels or
    targets: bytes = params.nbytes + X.nbytes + target.nbytes, copied into this thread's
    cached buffers for a network of layer ``sizes`` (see :func:`_step_buffers`), which also
    hold the gradient, the per-row losses and the step's activations and their gradients."""
    X, target = np.ascontiguousarray(X), np.ascontiguousarray(target)
    staged = _step_buffers(params, X, target, sizes)
    staged.params.copy_to_device(params)
    staged.X.copy_to_device(X)
    staged.target.copy_to_device(target)
    return staged


@_one_at_a_time_in_simulator
def compute(staged: Staged, loss: str, sizes, act) -> None:
    """Forward + ``loss`` ("softmax_xent" or "mse") + backward on the device, into
    ``staged.grad`` and ``staged.row_loss``; returns after ``cuda.synchronize()``, so the
    time of this call is the kernels' (launches are asynchronous)."""
    d_params, n_layers = staged.params, len(sizes) - 1
    if staged.acts and [a.shape[1] for a in staged.acts] != [int(m) for m in sizes[1:]]:
        raise ValueError(f"compute: staged for layer widths {[a.shape[1] for a in staged.acts]}"
                         f", called with sizes {list(sizes)}")
    k = _kernels(d_params.dtype)
    acts = _d_forward_all(d_params, sizes, act, staged.X, staged.acts)
    G = acts[-1]
    blocks, threads = _grid1(len(G))
    (k.softmax_xent if loss == "softmax_xent" else k.mse)[blocks, threads](
        G, staged.target, staged.row_loss)
    for layer in range(n_layers - 1, -1, -1):
        W, _ = _d_views(d_params, sizes, layer)
        dW, db = _d_views(staged.grad, sizes, layer)
        G_prev = staged.input_grads[layer - 1] if layer > 0 and staged.input_grads else None
        G = _d_layer_backward(W, acts[layer], acts[layer + 1], G,
                              act if layer < n_layers - 1 else 0, dW, db, layer > 0,
                              G_prev=G_prev)
    cuda.synchronize()


@_one_at_a_time_in_simulator
def stage_out(staged: Staged, grad) -> float:
    """Device -> host: the gradient into ``grad`` (grad.nbytes) and the mean loss (the
    per-row losses, 8 bytes a row, summed on the host)."""
    staged.grad.copy_to_host(grad)
    row_loss = staged.row_loss.copy_to_host()
    return float(row_loss.sum() / len(row_loss))


def _loss_and_grad(loss, params, grad, sizes, act, X, target):
    staged = stage_in(params, X, target, sizes)
    compute(staged, loss, sizes, act)
    return stage_out(staged, grad)


def loss_and_grad_xent(params, grad, sizes, act, X, y):
    """As kernels_cpu.loss_and_grad_xent, on the GPU: :func:`stage_in`, :func:`compute`,
    :func:`stage_out`."""
    return _loss_and_grad("softmax_xent", params, grad, sizes, act, X, y)


def loss_and_grad_mse(params, grad, sizes, act, X, T):
    """As kernels_cpu.loss_and_grad_mse, on the GPU (see :func:`loss_and_grad_xent`)."""
    return _loss_and_grad("mse", params, grad, sizes, act, X, T)
