"""Chapter 1 on a real GPU: coursekit's numba.cuda kernels vs cuBLAS (CuPy) vs the CPU path.

    python bench/bench_gpu_kernels.py                      # ~1 min on an H100 (compiles first)
    python bench/bench_gpu_kernels.py --json gpu.json      # also save the table as JSON
    python bench/bench_gpu_kernels.py --require-gpu        # exit 1 (not 0) without a CUDA GPU
    python bench/bench_gpu_kernels.py --tiles              # also sweep the matmul's blocking

Needs numpy, numba (with numba-cuda) and, for the cuBLAS anchor, cupy; run from anywhere
(the repository root is put on sys.path). Without a usable CUDA GPU it prints
"no CUDA GPU: nothing measured" and exits 0 (1 with ``--require-gpu``).

For each configuration (64-128-10 batch 32, 784-256-10 batch 256, 784-4096-10 batch 256),
one float32 training step's forward + backward (``loss_and_grad``, no update):

- **gpu step**: ``MLP(device="cuda").loss_and_grad(X, y, out=, validate=False)``, including
  the host<->device staging (parameters and batch up, gradient down);
- **gpu device-only**: the same kernels on arrays already on the device (CUDA events; it
  still allocates its activations and gradients, as the step does);
- **cpu step**: ``MLP(device="cpu")`` (coursekit's Numba kernels, ONE thread);
- **cuBLAS anchor**: CuPy's matmul for the same GEMMs of one step (per layer the forward
  product, A_prev^T delta and, below the top layer, delta W^T), as FLOP/s, and coursekit's
  ``_matmul`` on the same GEMM list (device-only) with its fraction of cuBLAS. Both as
  issued ("wall", numba's launch cost included) and as GPU time alone ("busy": the calls
  are queued behind a spin kernel, so the events time the kernels back to back); the
  30 % target is judged on busy time;
- **fp16**: chapter 8's mixed-precision step on the GPU (``kernels_cuda.loss_and_grad_mixed``,
  float16 storage, float32 accumulation; staged like the fp32 step) and its speed-up over
  the fp32 step, plus the same GEMM list with float16 inputs (device-only).

Before measuring, ``check()`` compares the GPU kernels with NumPy and the CPU path (all
four transposes of the product, split-K, fp32 and fp64 gradients, fp16 against the CPU
emulation) and the run stops if one is wrong. Each time is the best of ``--repeats``
windows of several steps after a warm-up (the first call compiles). Ratios are taken in
one run, on one machine: compare them, not the absolute times, across machines.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")  # the CPU contestant runs on one thread

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CONFIGS = {
    "a": {"label": "(a) 64-128-10, batch 32", "sizes": (64, 128, 10), "batch": 32},
    "b": {"label": "(b) 784-256-10, batch 256", "sizes": (784, 256, 10), "batch": 256},
    "c": {"label": "(c) 784-4096-10, batch 256", "sizes": (784, 4096, 10), "batch": 256},
    "t": {"label": "(t) tiny smoke test 11-19-3, batch 10", "sizes": (11, 19, 3), "batch": 10},
}
TARGET_CUBLAS_FRACTION = 0.30  # issue 27: the matmul at >= 30 % of cuBLAS on (b) and (c)


def gpu_available() -> bool:
    try:
        from numba import cuda

        return bool(cuda.is_available()) and len(cuda.gpus) > 0
    except Exception:  # noqa: BLE001 - no driver, no numba-cuda: no GPU for us
        return False


def best_time(fn, *, repeats: int, min_window: float = 0.02, sync=None) -> float:
    """Seconds per call: best over ``repeats`` windows, each long enough to time reliably."""
    fn()
    if sync:
        sync()
    n, t = 1, 0.0
    while True:  # calibrate the calls per window
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if sync:
            sync()
        t = time.perf_counter() - t0
        if t >= min_window or n >= 1 << 14:
            break
        n *= 2
    best = t / n
    for _ in range(repeats - 1):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        if sync:
            sync()
        best = min(best, (time.perf_counter() - t0) / n)
    return best


_INNER = 2 if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1" else 20  # calls per timed window


def event_time(fn, *, repeats: int, inner: int = _INNER) -> float:
    """Seconds per call of a device-only ``fn`` between numba CUDA events (best window)."""
    from numba import cuda

    fn()
    cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        start, stop = cuda.event(), cuda.event()
        start.record()
        for _ in range(inner):
            fn()
        stop.record()
        stop.synchronize()
        best = min(best, max(start.elapsed_time(stop), 1e-9) / 1e3 / inner)  # (0 in the simulator)
    return best


_SPIN = {}


def _spin():
    """A one-thread kernel that keeps the GPU busy ~n microseconds (nanosleep)."""
    if "k" not in _SPIN:
        from numba import cuda

        @cuda.jit
        def spin(n):
            for _ in range(n):
                cuda.nanosleep(1000)

        _SPIN["k"] = spin
    return _SPIN["k"]


def busy_time(fn, *, repeats: int, inner: int = 20) -> float:
    """GPU time per call of ``fn`` without the CPU's launch overhead: a spin kernel holds the
    GPU while the calls are queued behind it, so the events around them time the kernels
    back to back. The spin grows until the queueing takes less than it (checked)."""
    from numba import cuda

    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return event_time(fn, repeats=repeats, inner=inner)
    spin = _spin()
    fn()
    cuda.synchronize()
    n_spin, best = 2000, float("inf")
    for _ in range(repeats):
        while True:
            s0, s1 = cuda.event(), cuda.event()
            s0.record()
            spin[1, 1](n_spin)
            start, stop = cuda.event(), cuda.event()
            start.record()
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            stop.record()
            queued = time.perf_counter() - t0
            stop.synchronize()
            held = s0.elapsed_time(start) / 1e3
            if queued < 0.8 * held:
                break
            n_spin *= 2  # the GPU may have idled while we queued: hold it longer
            if n_spin > 1 << 18:  # fn synchronizes (an allocation): no busy time for it
                return float("nan")
        best = min(best, start.elapsed_time(stop) / 1e3 / inner)
    return best


def overheads(repeats: int) -> dict:
    """CPU cost of one numba kernel launch (4 2-D arrays + 4 scalars, like the matmul) and
    of one cuda.device_array (256 x 4096 float32)."""
    from numba import cuda

    @cuda.jit
    def empty(A, B, C, bias, act, ta, tb, k):
        pass

    A = cuda.device_array((4, 4), np.float32)
    b = cuda.device_array(4, np.float32)
    launch = best_time(lambda: empty[1, 32](A, A, A, b, 0, False, False, 4), repeats=repeats,
                       sync=cuda.synchronize)
    alloc = best_time(lambda: cuda.device_array((256, 4096), np.float32), repeats=repeats,
                      sync=cuda.synchronize)
    return {"launch_s": launch, "device_array_s": alloc}


def step_gemms(sizes, n):
    """The (M, N, K, trans_a, trans_b) of one step's products: forward A_prev W, then per
    layer A_prev^T delta and (below the top) delta W^T."""
    out = [(n, o, i, False, False) for i, o in zip(sizes[:-1], sizes[1:])]
    for layer in range(len(sizes) - 2, -1, -1):
        i, o = sizes[layer], sizes[layer + 1]
        out.append((i, o, n, True, False))
        if layer > 0:
            out.append((n, i, o, False, True))
    return out


def gemm_operands(gemms, dtype, rng, to_device):
    ops = []
    for M, N, K, ta, tb in gemms:
        A = rng.standard_normal((K, M) if ta else (M, K)).astype(dtype)
        B = rng.standard_normal((N, K) if tb else (K, N)).astype(dtype)
        ops.append((to_device(A), to_device(B), ta, tb))
    return ops


def gemm_flops(gemms) -> float:
    return float(sum(2 * M * N * K for M, N, K, _, _ in gemms))


def check() -> list[str]:
    """Correctness on the real GPU before any timing; returns the checks passed."""
    from numba import cuda

    from coursekit.nn import MLP
    from coursekit.nn import kernels_cuda as kc
    from coursekit.nn.mixed_precision import MixedPrecision

    rng = np.random.default_rng(0)
    done = []
    for dtype, rtol in ((np.float64, 1e-12), (np.float32, 1e-4), (np.float16, 4e-3)):
        for ta in (False, True):
            for tb in (False, True):
                for splits in (1, 3, None):
                    m, k, n = 131, 300, 77
                    A = rng.standard_normal((k, m) if ta else (m, k)).astype(dtype)
                    B = rng.standard_normal((n, k) if tb else (k, n)).astype(dtype)
                    want = ((A.T if ta else A).astype(np.float64)
                            @ (B.T if tb else B).astype(np.float64))
                    got = kc._matmul(cuda.to_device(A), cuda.to_device(B), ta, tb,
                                     splits=splits).copy_to_host().astype(np.float64)
                    err = np.abs(got - want).max() / np.abs(want).max()
                    if not err <= rtol:
                        raise AssertionError(f"matmul {np.dtype(dtype).name} trans=({ta}, {tb}) "
                                             f"splits={splits}: relative error {err:.2e} > {rtol}")
        done.append(f"matmul {np.dtype(dtype).name}: 4 transposes x splits 1/3/auto")
    X, y = rng.standard_normal((200, 784)), rng.integers(0, 10, 200)
    for dtype, tol in ((np.float32, 1e-4), (np.float64, 1e-11)):
        for act in ("relu", "sigmoid", "tanh"):
            cpu = MLP((784, 300, 70, 10), act, dtype=dtype, seed=1)
            gpu = MLP((784, 300, 70, 10), act, dtype=dtype, seed=1, device="cuda")
            (lc, gc), (lg, gg) = cpu.loss_and_grad(X, y), gpu.loss_and_grad(X, y)
            err = np.abs(gg - gc).max() / np.abs(gc).max()
            if not (abs(lg - lc) <= tol * abs(lc) and err <= tol):
                raise AssertionError(f"loss_and_grad {np.dtype(dtype).name} {act}: loss "
                                     f"{lg} vs {lc}, gradient error {err:.2e} > {tol}")
    done.append("loss_and_grad cuda == cpu (fp32 1e-4, fp64 1e-11; relu, sigmoid, tanh)")
    model = MLP((784, 300, 70, 10), "relu", seed=1)
    cpu = MixedPrecision(model.copy(), "fp16", device="cpu")
    gpu = MixedPrecision(model.copy(), "fp16", device="cuda")
    (lc, gc), (lg, gg) = cpu.loss_and_grad(X, y), gpu.loss_and_grad(X, y)
    err = np.abs(gg - gc).max() / np.abs(gc).max()
    if not (abs(lg - lc) <= 1e-2 * abs(lc) and err <= 2e-2):
        raise AssertionError(f"fp16 on the GPU vs the CPU emulation: loss {lg} vs {lc}, "
                             f"gradient error {err:.2e}")
    done.append(f"fp16 GPU step == CPU emulation (loss rel 1e-2, gradient {err:.1e} <= 2e-2)")
    return done


def measure(key: str, repeats: int, cp) -> dict:
    from numba import cuda

    from coursekit.nn import MLP
    from coursekit.nn import kernels_cuda as kc

    cfg = CONFIGS[key]
    sizes, n = cfg["sizes"], cfg["batch"]
    rng = np.random.default_rng(0)
    X = rng.standard_normal((n, sizes[0])).astype(np.float32)
    y = rng.integers(0, sizes[-1], n).astype(np.int64)
    gpu = MLP(sizes, "relu", device="cuda", seed=0)
    cpu = MLP(sizes, "relu", device="cpu", seed=0)
    buf = np.empty_like(gpu.params)
    row = {"config": cfg["label"], "sizes": list(sizes), "batch": n}
    row["gpu_step_s"] = best_time(lambda: gpu.loss_and_grad(X, y, out=buf, validate=False),
                                  repeats=repeats)
    row["cpu_step_s"] = best_time(lambda: cpu.loss_and_grad(X, y, out=buf, validate=False),
                                  repeats=repeats)
    sizes_arr = np.asarray(sizes, np.int64)
    staged = kc.stage_in(gpu.params, X, y, sizes_arr)  # kernels_cuda's own device-only part of a step
    row["gpu_device_only_s"] = event_time(
        lambda: kc.compute(staged, "softmax_xent", sizes_arr, gpu._act), repeats=repeats)
    gemms = step_gemms(sizes, n)
    flops = gemm_flops(gemms)
    row["gemm_flops"] = flops
    ops32 = gemm_operands(gemms, np.float32, rng, cuda.to_device)
    ops16 = [(cuda.to_device(A.copy_to_host().astype(np.float16)),
              cuda.to_device(B.copy_to_host().astype(np.float16)), ta, tb) for A, B, ta, tb in ops32]
    outs = [cuda.device_array((M, N), np.float32) for M, N, *_ in gemms]
    outs16 = [cuda.device_array((M, N), np.float16) for M, N, *_ in gemms]

    def ours(ops, outs):
        for (A, B, ta, tb), C in zip(ops, outs):
            kc._matmul(A, B, ta, tb, out=C)

    row["coursekit_gemms_s"] = event_time(lambda: ours(ops32, outs), repeats=repeats)
    row["coursekit_gemms_busy_s"] = busy_time(lambda: ours(ops32, outs), repeats=repeats)
    row["coursekit_gemms_fp16_busy_s"] = busy_time(lambda: ours(ops16, outs16), repeats=repeats)
    row["coursekit_gflops"] = flops / row["coursekit_gemms_busy_s"] / 1e9
    # (no busy time for the whole device step: its cuda.device_array calls synchronize)
    if cp is not None:
        cops = [(cp.asarray(A.copy_to_host()), cp.asarray(B.copy_to_host()), ta, tb)
                for A, B, ta, tb in ops32]
        couts = [cp.empty((M, N), cp.float32) for M, N, *_ in gemms]

        def cublas():
            for (A, B, ta, tb), C in zip(cops, couts):
                cp.matmul(A.T if ta else A, B.T if tb else B, out=C)

        row["cublas_gemms_s"] = best_time(cublas, repeats=repeats,
                                          sync=cp.cuda.Device().synchronize)
        row["cublas_gemms_busy_s"] = busy_time(cublas, repeats=repeats)
        row["cublas_gflops"] = flops / row["cublas_gemms_busy_s"] / 1e9
        row["fraction_of_cublas"] = row["cublas_gemms_busy_s"] / row["coursekit_gemms_busy_s"]
        row["fraction_of_cublas_wall"] = row["cublas_gemms_s"] / row["coursekit_gemms_s"]
    # chapter 8: the mixed-precision step on the GPU (fp16 storage, fp32 accumulation)
    w16 = gpu.params.astype(np.float16)
    g16 = np.empty_like(w16)
    X16 = X.astype(np.float16)
    row["gpu_fp16_step_s"] = best_time(
        lambda: kc.loss_and_grad_mixed(w16, g16, sizes_arr, gpu._act, X16, y, scale=1024.0),
        repeats=repeats)
    w32, g32 = gpu.params.copy(), np.empty_like(gpu.params)
    row["gpu_mixed_fp32_step_s"] = best_time(
        lambda: kc.loss_and_grad_mixed(w32, g32, sizes_arr, gpu._act, X, y, scale=1024.0),
        repeats=repeats)
    row["fp16_speedup"] = row["gpu_mixed_fp32_step_s"] / row["gpu_fp16_step_s"]
    row["fp16_gemm_speedup"] = row["coursekit_gemms_busy_s"] / row["coursekit_gemms_fp16_busy_s"]
    row["gpu_vs_cpu"] = row["cpu_step_s"] / row["gpu_step_s"]
    return row


def tile_sweep(repeats: int, cp) -> list[dict]:
    """The big products of (c) under several blockings (the default is kernels_cuda.TILE)."""
    from numba import cuda

    from coursekit.nn import kernels_cuda as kc

    rng = np.random.default_rng(1)
    gemms = step_gemms(CONFIGS["c"]["sizes"], CONFIGS["c"]["batch"])
    ops = gemm_operands(gemms, np.float32, rng, cuda.to_device)
    outs = [cuda.device_array((M, N), np.float32) for M, N, *_ in gemms]
    tiles = [kc.Tile(64, 64, 16, 4, 4), kc.Tile(64, 64, 8, 4, 4), kc.Tile(128, 64, 8, 8, 4),
             kc.Tile(128, 128, 8, 8, 8), kc.Tile(64, 128, 8, 4, 8), kc.Tile(32, 32, 16, 2, 2)]
    rows = []
    for tile in tiles:
        def run(tile=tile):
            for (A, B, ta, tb), C in zip(ops, outs):
                kc._matmul(A, B, ta, tb, out=C, tile=tile)
        s = busy_time(run, repeats=repeats)
        rows.append({"tile": tile._asdict(), "gemms_s": s, "gflops": gemm_flops(gemms) / s / 1e9})
    return rows


def fmt_us(s: float) -> str:
    return f"{s * 1e6:.1f} us" if s < 1e-3 else f"{s * 1e3:.2f} ms"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--json", metavar="PATH", help="also write the table as JSON here")
    ap.add_argument("--require-gpu", action="store_true", help="exit 1 when there is no GPU")
    ap.add_argument("--repeats", type=int, default=7, help="timed windows per number (best)")
    ap.add_argument("--configs", default="abc", help="which configurations (default abc)")
    ap.add_argument("--tiles", action="store_true", help="also sweep the matmul's blocking")
    ap.add_argument("--no-check", action="store_true", help="skip the correctness checks")
    args = ap.parse_args(argv)
    if not gpu_available():
        print("no CUDA GPU: nothing measured")
        if args.json:
            Path(args.json).write_text(json.dumps({"gpu": None, "rows": []}, indent=1))
        return 1 if args.require_gpu else 0
    from numba import cuda

    try:
        import cupy as cp
    except ImportError:
        cp = None
        print("cupy not installed: no cuBLAS anchor")
    if hasattr(cuda, "get_current_device"):
        name = cuda.get_current_device().name
        name = name.decode() if isinstance(name, bytes) else str(name)
    else:
        name = "numba CUDA simulator (times mean nothing)"
    import numba

    from coursekit.nn import kernels_cuda as kc

    result = {"gpu": name, "python": platform.python_version(), "numpy": np.__version__,
              "numba": numba.__version__, "cupy": getattr(cp, "__version__", None),
              "tile": kc.TILE._asdict(), "target_fraction_of_cublas": TARGET_CUBLAS_FRACTION}
    print(f"GPU {name}; numba {numba.__version__}; cupy {result['cupy']}; tile {kc.TILE}")
    if not args.no_check:
        t0 = time.perf_counter()
        result["checks"] = check()
        print(f"checks passed ({time.perf_counter() - t0:.1f} s, includes compiling):")
        for line in result["checks"]:
            print("  " + line)
    rows = []
    for key in args.configs:
        rows.append(measure(key, args.repeats, cp))
        if args.json:  # keep what was measured if a later configuration fails
            Path(args.json).write_text(json.dumps({**result, "rows": rows}, indent=1))
    result["rows"] = rows
    result["overheads"] = overheads(args.repeats)
    print(f"one numba kernel launch: {fmt_us(result['overheads']['launch_s'])} of CPU; one "
          f"cuda.device_array: {fmt_us(result['overheads']['device_array_s'])}")
    head = ("| configuration | gpu step (staged) | gpu device-only | cpu step (1 thread) "
            "| gpu vs cpu | coursekit GEMMs (wall / busy) | cuBLAS GEMMs (wall / busy) "
            "| % of cuBLAS (busy / wall) | fp16 step | fp16 speed-up (step / GEMMs busy) |")
    print("\n" + head + "\n" + "|---" * 10 + "|")
    for r in rows:
        frac = r.get("fraction_of_cublas")
        verdict = "" if frac is None or r["batch"] < 256 else (
            " met" if frac >= TARGET_CUBLAS_FRACTION else " MISSED")
        cub = (f"{fmt_us(r['cublas_gemms_s'])} / {fmt_us(r['cublas_gemms_busy_s'])} "
               f"({r['cublas_gflops']:.0f} GFLOP/s)" if "cublas_gemms_s" in r else "n/a")
        pct = ("n/a" if frac is None else
               f"{100 * frac:.0f} %{verdict} / {100 * r['fraction_of_cublas_wall']:.0f} %")
        print(f"| {r['config']} | {fmt_us(r['gpu_step_s'])} | {fmt_us(r['gpu_device_only_s'])} "
              f"| {fmt_us(r['cpu_step_s'])} "
              f"| {r['gpu_vs_cpu']:.2f}x | {fmt_us(r['coursekit_gemms_s'])} / "
              f"{fmt_us(r['coursekit_gemms_busy_s'])} ({r['coursekit_gflops']:.0f} GFLOP/s) | {cub} "
              f"| {pct} "
              f"| {fmt_us(r['gpu_fp16_step_s'])} | {r['fp16_speedup']:.2f}x / "
              f"{r['fp16_gemm_speedup']:.2f}x |")
    if args.tiles:
        result["tile_sweep"] = tile_sweep(args.repeats, cp)
        print("\ntile sweep, GEMMs of (c):")
        for t in result["tile_sweep"]:
            print(f"  {t['tile']}: {fmt_us(t['gemms_s'])} ({t['gflops']:.0f} GFLOP/s)")
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))
        print(f"\nwrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
