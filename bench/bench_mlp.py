"""Chapter 1 benchmark: one MLP training step, coursekit's Numba kernels vs NumPy vs PyTorch eager.

    .venv/bin/python bench/bench_mlp.py              # about 25 s
    .venv/bin/python bench/bench_mlp.py --rounds 3   # about 12 s, noisier
    .venv/bin/python bench/bench_mlp.py --json results.json

A step is forward + backward + SGD update on one float32 mini-batch, the same weights and
batch for every contestant, all on ONE thread (BLAS, OpenMP, Numba and PyTorch pools).
Contestants (``coursekit.nn.speed.training_steps``): coursekit's Numba kernels
(``loss_and_grad(out=, validate=False)`` + ``SGD.step``); "numpy (tight)", the fast step a
competent NumPy user writes (``TightNumpyStep``: preallocated buffers, ``np.dot(out=)``,
in-place ops, fused softmax-xent gradient, no checks), the fair NumPy baseline; "numpy
(reference)", the readable ``coursekit.nn.reference`` (a temporary per operation), shown
for comparison; PyTorch eager when installed.
Configurations: (a) digits-sized 64-128-10, batch 32; (b) 784-256-10, batch 256.
Each contestant, and the single-thread SGEMM peak (the ceiling for (b)), is timed in
interleaved rounds of short windows (~10 ms) and the best window counts, so a burst of
load on a shared machine hurts all of them alike and rarely hides the undisturbed speed.
Also printed: Numba's compile time in a fresh process with an empty cache (cold) and again
with the cache that run wrote (cached), and the price of the checks: the public default
``mlp.loss_and_grad(X, y)`` (validates X and y, allocates the gradient) against
``loss_and_grad(X, y, out=buf, validate=False)``, with X a C-contiguous float32 array and
y int64 labels (other inputs are converted first, which costs more).

Share of the SGEMM peak (issue 30): for each configuration the bench prints the public
``loss_and_grad`` path (``out=``, ``validate=False``; and the default, checked call) as a
fraction of the peak, counting ``coursekit.nn.flops.mlp_step_flops`` (the products a step
needs: 2 n sum n_in n_out forward, twice that backward less the first layer's input gradient;
1,294,336 FLOPs for (a)), and beside it the same products alone (``coursekit.nn.speed.products_only``:
the step's ``np.dot`` calls, five for (a), same shapes and operand layouts, in one compiled
call, no elementwise work): the most a step built on these BLAS calls can reach. It also reports
which BLAS libraries and kernel sets ran (threadpoolctl: NumPy's, and SciPy's, the one
``np.dot`` inside Numba calls) and the ``OPENBLAS_CORETYPE`` / ``OPENBLAS_L2_SIZE`` it saw:
some machines set them, which forces older kernels; run the bench once as is and once with
``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE`` to see both (never change them in tests).

Targets: issue 3 set (a) >= 10x faster than PyTorch eager and >= 2.5x faster than NumPy,
(b) >= 1.2x faster than PyTorch and >= 75 % of the SGEMM peak. The 2.5x was set against
the readable reference; issue 15 made the tight step the NumPy contestant, so the verdict
now holds the same 2.5x against the tight step (not lowered), and the ratio against the
reference is still printed, without a verdict. Issue 15 also set: the default
``loss_and_grad`` within 1.3x of the ``out=`` / ``validate=False`` path on (a).
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"  # before NumPy, Numba or PyTorch start their thread pools

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

CONFIGS = {
    "a": {"label": "(a) 64-128-10, batch 32", "sizes": (64, 128, 10), "batch": 32},
    "b": {"label": "(b) 784-256-10, batch 256", "sizes": (784, 256, 10), "batch": 256},
}
TIGHT, REFERENCE = "numpy (tight)", "numpy (reference)"
TARGETS = {"a": {TIGHT: 2.5, "pytorch": 10.0}, "b": {"pytorch": 1.2, "peak_fraction": 0.75}}
CHECKED_PATH_TARGET = {"a": 1.3}  # default loss_and_grad / out= + validate=False, at most
PUBLIC_PATH_PEAK_TARGET = {"a": 0.70}  # issue 30: loss_and_grad(out=, validate=False) / peak
OPENBLAS_VARIABLES = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def compile_probe() -> None:
    """Child process: time importing coursekit.nn and the first (compiling or cache-loading) step."""
    t0 = time.perf_counter()
    from coursekit.nn import MLP, SGD

    t1 = time.perf_counter()
    cfg = CONFIGS["a"]
    mlp = MLP(cfg["sizes"], seed=0)
    rng = np.random.default_rng(0)
    X = rng.standard_normal((cfg["batch"], cfg["sizes"][0])).astype(np.float32)
    _, grad = mlp.loss_and_grad(X, rng.integers(0, 10, cfg["batch"]))
    SGD(mlp.params, 0.1).step(grad)
    t2 = time.perf_counter()
    print(json.dumps({"import_s": t1 - t0, "first_step_s": t2 - t1}))


def compile_times() -> dict:
    """Cold (empty cache) and cached first-step times, each in a fresh Python process."""
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "NUMBA_CACHE_DIR": cache}
        for kind in ("cold", "cached"):
            proc = subprocess.run(
                [sys.executable, __file__, "--compile-probe"], env=env, capture_output=True, text=True, check=True
            )
            out[kind] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


def blas_report() -> dict:
    """The BLAS libraries loaded (threadpoolctl) and the OPENBLAS_* variables this process saw."""
    from threadpoolctl import threadpool_info

    libraries = [
        {"library": os.path.basename(info["filepath"]), "api": info["internal_api"],
         "version": info.get("version"), "kernels": info.get("architecture")}
        for info in threadpool_info() if info["user_api"] == "blas"
    ]
    return {"libraries": libraries, "environment": {v: os.environ.get(v) for v in OPENBLAS_VARIABLES}}


def measure(rounds: int) -> tuple[float, dict]:
    """(SGEMM peak FLOP/s, {config: {"seconds": {contestant: s}, "loss_and_grad": {path: s},
    "flops": n}}), all timed in the same interleaved rounds."""
    from coursekit.nn import MLP, flops
    from coursekit.nn.speed import best_time, measure_matmul_peak, products_only, training_steps

    timed, results = {}, {}
    for key, cfg in CONFIGS.items():
        sizes, batch = cfg["sizes"], cfg["batch"]
        rng = np.random.default_rng(0)
        X = rng.standard_normal((batch, sizes[0])).astype(np.float32)
        y = rng.integers(0, sizes[-1], batch)
        mlp = MLP(sizes, seed=0)
        buf = np.empty_like(mlp.params)
        paths = {
            "default": lambda mlp=mlp, X=X, y=y: mlp.loss_and_grad(X, y),
            "out=, validate=False": lambda mlp=mlp, X=X, y=y, buf=buf: mlp.loss_and_grad(
                X, y, out=buf, validate=False
            ),
        }
        paths["products alone"] = products_only(MLP(sizes, seed=0), batch)
        timed[key] = {"seconds": training_steps(MLP(sizes, seed=0), X, y, lr=1e-3), "loss_and_grad": paths}
        results[key] = {group: dict.fromkeys(fns, float("inf")) for group, fns in timed[key].items()}
        results[key]["flops"] = flops.mlp_step_flops(sizes, batch)["total"]
    peak = max(measure_matmul_peak(n) for n in (1024, 2048))
    for _ in range(rounds):
        peak = max(peak, measure_matmul_peak(512, repeats=5, min_seconds=0.005))
        for key, groups in timed.items():
            for group, fns in groups.items():
                best = results[key][group]
                for name, fn in fns.items():
                    best[name] = min(best[name], best_time(fn, repeats=5, min_seconds=0.01))
    return peak, results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7, help="interleaved timing rounds (default 7)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    parser.add_argument("--compile-probe", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.compile_probe:
        compile_probe()
        return 0

    compiled = compile_times()  # first, while this process has not touched Numba yet
    import numba

    from coursekit.nn.speed import single_thread

    try:
        import torch

        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    with single_thread():
        peak, results = measure(args.rounds)
        blas = blas_report()  # inside the block: SciPy's BLAS is loaded by now

    print("coursekit chapter 1: one SGD training step (forward + backward + update), float32, 1 thread")
    print(
        f"{platform.processor() or platform.machine()}; numpy {np.__version__}, numba {numba.__version__}, "
        f"torch {torch_version or 'not installed'}"
    )
    for lib in blas["libraries"]:
        print(f"BLAS: {lib['library']} ({lib['api']} {lib['version']}), kernels: {lib['kernels']}")
    print("  " + ", ".join(f"{v}={blas['environment'][v] or '(unset)'}" for v in OPENBLAS_VARIABLES))
    print(f"single-thread SGEMM peak, measured in the same rounds (NumPy BLAS, n = 512, 1024, 2048): "
          f"{peak / 1e9:.1f} GFLOP/s\n")
    verdicts = []
    for key, r in results.items():
        s = r["seconds"]
        r["speedup"] = {n: s[n] / s["numba"] for n in s if n != "numba"}  # how many times numba is faster
        r["gflops"] = {n: r["flops"] / t / 1e9 for n, t in s.items()}
        r["peak_fraction"] = r["flops"] / s["numba"] / peak
        print(f"{CONFIGS[key]['label']:<28}{'us/step':>10}{'numba faster':>14}{'GFLOP/s':>9}{'% peak':>8}")
        for n, t in s.items():
            ratio = "" if n == "numba" else f"{r['speedup'][n]:.2f}x"
            gflops = r["gflops"][n]
            print(f"  {n:<26}{t * 1e6:>10.1f}{ratio:>14}{gflops:>9.1f}{100 * gflops * 1e9 / peak:>7.0f}%")
        for what, goal in TARGETS[key].items():
            got = r["peak_fraction"] if what == "peak_fraction" else r["speedup"].get(what)
            if got is None:
                verdicts.append(f"({key}) vs {what}: not measured ({what} not installed)")
                continue
            shown = f"{100 * got:.0f}% of peak (target {100 * goal:.0f}%)" if what == "peak_fraction" else (
                f"{got:.2f}x vs {what} (target {goal}x{', set in issue 3 against the reference' * (what == TIGHT)})"
            )
            verdicts.append(f"({key}) {shown}: {'met' if got >= goal else 'MISSED'}")
        if TIGHT not in TARGETS[key]:
            verdicts.append(f"({key}) {r['speedup'][TIGHT]:.2f}x vs {TIGHT} (no target)")
        verdicts.append(
            f"({key}) {r['speedup'][REFERENCE]:.2f}x vs {REFERENCE} (the baseline of issue 3's targets; "
            f"shown, not judged)"
        )
        paths = r["loss_and_grad"]
        r["checked_path_ratio"] = ratio = paths["default"] / paths["out=, validate=False"]
        line = (f"({key}) default loss_and_grad(X, y) {paths['default'] * 1e6:.1f} us vs out=/validate=False "
                f"{paths['out=, validate=False'] * 1e6:.1f} us: {ratio:.2f}x")
        goal = CHECKED_PATH_TARGET.get(key)
        verdicts.append(line + (f" (target <= {goal}x): {'met' if ratio <= goal else 'MISSED'}" if goal
                                else " (no target)"))
        r["path_peak_fraction"] = shares = {p: r["flops"] / t / peak for p, t in paths.items()}
        print(f"  share of the SGEMM peak, counting {r['flops']:,} FLOPs per step "
              f"(flops.mlp_step_flops: the products one step needs):")
        for p, t in paths.items():
            what = "step's matrix products alone (BLAS, one compiled call)" if p == "products alone" else (
                f"loss_and_grad, {p}")
            print(f"    {what:<56}{t * 1e6:>9.1f} us{100 * shares[p]:>6.0f}%")
        goal = PUBLIC_PATH_PEAK_TARGET.get(key)
        if goal:
            got = shares["out=, validate=False"]
            verdicts.append(
                f"({key}) loss_and_grad(out=, validate=False) at {100 * got:.0f}% of the SGEMM peak (target "
                f"{100 * goal:.0f}%, issue 30): {'met' if got >= goal else 'MISSED'}; its products alone "
                f"reach {100 * shares['products alone']:.0f}%"
            )
        print()
    print("\n".join(verdicts))
    cold, cached = compiled["cold"], compiled["cached"]
    print(
        f"\nNumba compile of the step kernels (fresh process): cold {cold['first_step_s']:.2f} s, "
        f"cached {cached['first_step_s']:.3f} s (import coursekit.nn {cached['import_s']:.2f} s)"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"peak_flops": peak, "blas": blas, "results": results, "compile": compiled}, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
