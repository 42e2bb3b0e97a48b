"""Load figures (issue 17): long-run memory, allreduce peak memory, 8 ranks, a long async run.

    .venv/bin/python bench/bench_load.py            # ~5 min (the async run alone is 2 min)
    .venv/bin/python bench/bench_load.py --quick    # < 2 min: fewer messages, 64 MiB, 15 s async
    .venv/bin/python bench/bench_load.py --only messages async --json load.json

Four sections (``--only`` picks some); each prints a markdown table, ``--json FILE`` also
saves every number:

* ``messages``: a long loop of small messages (8-byte ``sendrecv`` and 2-rank ring
  ``allreduce``, alternating) on 2 ``run_local`` ThreadComm ranks and on 2 ``run_procs``
  processes (ZmqComm), with tracing off (every backend's default) and on.
  RSS (per process: the 2 ThreadComm ranks share one) is sampled as the loop runs; the
  table gives the growth per 100k messages each rank sent (least-squares slope over the
  second half of the loop) and the trace length at the end. A bounded trace shows a slope
  near zero once it is full (a ThreadComm trace holds ``trace.MAX_MESSAGES`` = 100k
  records: 50k sendrecvs).
* ``memory``: every ``allreduce`` algorithm (and ``hierarchical_allreduce``, 2 ranks per
  node) on 4 ``run_procs`` processes with a 64 MiB float32 array (and 512 MiB without
  ``--quick``: on 4 processes when MemAvailable allows ~9.5 GiB, else on 2). Each rank
  measures the call's peak extra memory two ways: tracemalloc (NumPy reports its buffers
  to it; libzmq's buffers are invisible to it) and the RSS high-water mark (``VmHWM`` in
  /proc/self/status, reset through /proc/self/clear_refs before the call, minus the RSS
  before it). Both are shown as a multiple of the array size, for the first call on a
  fresh comm ("cold": the collective work array is allocated), the next one ("warm") and
  an in-place call (``out=x``, warm), beside the model in :data:`MODEL` (the result array
  + the work arrays the code allocates; RSS adds one libzmq receive buffer per message
  that goes over TCP). The max over ranks counts.
* ``ranks``: ring and recursive-doubling allreduce (ring is the default) of 1 MiB and
  16 MiB on 2, 4 and 8 processes of this 2-core machine: median time of one call (slowest
  rank, after a barrier), bus bandwidth, and whether every call finished with the right sum.
* ``async``: one asynchronous parameter-server run (SSP, staleness 2, 1 shard, 3 workers,
  ``train_ps`` on ThreadComm ranks via ``LocalRunner.start``, as
  ``async_sgd.train`` does, a snapshot every ``--async-eval-every`` steps: 10, chapter 4's)
  sized from a short calibration run to last ``--async-seconds`` (default 120; 15 s with
  ``--quick``); RSS, open file descriptors (/proc/self/fd), threads and the slowest
  worker's step (from its live data) are sampled while it runs. The table gives the time
  per step (wall clock, and this process's CPU time, which other jobs disturb less) and the
  RSS growth per step at the start (5-25% of the steps) and at the end (75-100%): a long
  run must hold both flat (issue 29: the workers' span lists grew
  ~1.2 KB per step and were summed at every snapshot, so each step got slower), the
  records each rank kept, and each rank's trace length and dropped count.

Timings on a shared 2-vCPU machine are noisy; memory figures are what this bench is for.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
SECTIONS = ("messages", "memory", "ranks", "async")

def _lg(p: int) -> int:
    return (p - 1).bit_length()


def _pow2(p: int) -> bool:
    return p & (p - 1) == 0


MODEL = {
    # algorithm: (NumPy work arrays in units of n (kept on the comm between calls, except
    # hierarchical's), libzmq receive buffers in units of n (RSS only), what it says)
    "ring": (lambda p: 1 / p, lambda p: 0.0,
             "work array n/p (the largest chunk); chunks >= 256 KiB move by single copy"),
    "reduce_bcast": (lambda p: 1.0, lambda p: float(_lg(p)),
                     "work array n; plain send/recv go over TCP: libzmq holds a message of n "
                     "per child that sent, up to lg p at the root"),
    "recursive_doubling": (lambda p: 1.0, lambda p: 0.0 if _pow2(p) else 1.0,
                           "work array n (+ libzmq n for the fold when p is not a power of 2)"),
    "rabenseifner": (lambda p: 1.0, lambda p: 0.0 if _pow2(p) else 1.0,
                     "work array n, half of it used (+ libzmq n for the fold)"),
    "hierarchical": (lambda p: 0.5 + (0.5 / (p // 2) if p > 2 else 0.0), lambda p: 0.0,
                     "work arrays n/k + n/(k m) on sub-comms built per call, so allocated "
                     "every call (k = 2 ranks per node, m = p/k nodes)"),
}
"""Extra memory of one allreduce (n = the array's bytes), beside the n-byte result that
``allreduce(x)`` allocates (none with ``out=x``). Cold = the first call on a comm."""


def model(alg: str, p: int) -> dict:
    work, tcp, note = MODEL[alg]
    if alg == "hierarchical":  # fresh sub-comms: the work arrays come back every call
        return {"cold": 1 + work(p), "warm": 1 + work(p), "tcp": tcp(p), "note": note}
    return {"cold": 1 + work(p), "warm": 1.0, "inplace": 0.0, "tcp": tcp(p), "note": note}


# ---- measuring a process --------------------------------------------------------------------
def rss() -> int:
    """Resident set size of this process in bytes (psutil when installed, else /proc)."""
    try:
        import psutil
        return psutil.Process().memory_info().rss
    except ImportError:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise KeyError(field)


def reset_hwm() -> bool:
    """Reset VmHWM (peak RSS) to the current RSS; False where the kernel does not allow it."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def mem_available() -> int:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def slope_per_100k(xs, ys, skip: float = 0.5) -> float:
    """Least-squares slope of ys over xs, times 1e5, ignoring the first ``skip`` of the points."""
    xs, ys = np.asarray(xs, float), np.asarray(ys, float)
    keep = xs >= xs[-1] * skip
    if keep.sum() < 2:
        return float("nan")
    return float(np.polyfit(xs[keep], ys[keep], 1)[0] * 1e5)


# ---- section 1: long-run memory of small messages -------------------------------------------
def message_loop(comm, n_messages: int, n_samples: int, tracing=None) -> dict:
    """Rank body: ``n_messages`` small sends per rank; (sent, RSS, trace length) samples."""
    from coursekit.collectives import allreduce
    if tracing is not None:
        comm.tracing = tracing
    peer = comm.rank ^ 1
    x, buf = np.ones(2, np.float32), np.empty(2, np.float32)
    block = max(n_messages // n_samples, 4)
    gc.collect()
    comm.barrier()
    sent, samples, t0 = 0, [], time.perf_counter()
    samples.append((0, rss(), len(comm.trace)))
    while sent < n_messages:
        for _ in range(block // 4):  # 8-byte sendrecv: 1 message sent per call
            comm.sendrecv(x, peer, source=peer, out=buf)
        for _ in range(block // 4):  # 2-rank ring allreduce of 8 bytes: 2 per call
            allreduce(comm, x, check=False, out=buf)
        sent += block // 4 * 3
        samples.append((sent, rss(), len(comm.trace)))
    seconds = time.perf_counter() - t0
    comm.barrier()
    trace = comm.trace
    return {"sent": sent, "seconds": seconds, "samples": samples, "trace_len": len(trace),
            "trace_dropped": getattr(trace, "dropped", 0),
            "trace_max": getattr(trace, "maxlen", None), "tracing": comm.tracing}


def section_messages(args) -> list[dict]:
    from coursekit.comm import run_local
    from coursekit.comm.procs import run_procs
    import bench_load

    n_thread = 150_000 if args.quick else 300_000
    n_proc = 30_000 if args.quick else 200_000
    runs = [
        ("ThreadComm (run_local), tracing off (default)", "thread", n_thread, None),
        ("ThreadComm (run_local), tracing on", "thread", n_thread, True),
        ("ZmqComm (run_procs), tracing off (default)", "procs", n_proc, None),
        ("ZmqComm (run_procs), tracing on", "procs", n_proc, True),
    ]
    rows = []
    for name, kind, n, tracing in runs:
        gc.collect()
        if kind == "thread":
            out = run_local(message_loop, 2, n, 40, tracing, timeout=60)
        else:
            out = run_procs(bench_load.message_loop, 2, n, 40, trace=bool(tracing), timeout=600)
        for rank, r in enumerate(out):
            if kind == "thread" and rank:
                continue  # one process: rank 0's samples say it all
            sent, mem, tlen = zip(*r["samples"])
            rows.append({
                "run": name, "rank": rank, "messages_per_rank": r["sent"],
                "us_per_message": r["seconds"] / r["sent"] * 1e6,
                "rss_start_mib": mem[0] / MiB, "rss_end_mib": mem[-1] / MiB,
                "rss_growth_mib_per_100k": slope_per_100k(sent, mem) / MiB,
                "trace_len": r["trace_len"], "trace_dropped": r["trace_dropped"],
                "trace_max": r["trace_max"], "tracing": r["tracing"], "samples": r["samples"],
            })
    print("\n## Long-run memory: small messages (sendrecv + 2-rank ring allreduce)\n")
    print("| run | rank | messages/rank | us/message | RSS start MiB | RSS end MiB "
          "| growth MiB/100k msgs | trace len | dropped | trace max |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['run']} | {r['rank']} | {r['messages_per_rank']} | "
              f"{r['us_per_message']:.1f} | {r['rss_start_mib']:.1f} | {r['rss_end_mib']:.1f} | "
              f"{r['rss_growth_mib_per_100k']:.2f} | {r['trace_len']} | {r['trace_dropped']} | "
              f"{r['trace_max']} |")
    return rows


# ---- section 2: allreduce peak memory ---------------------------------------------------------
def _measure(fn) -> dict:
    """Run fn(); the peak extra bytes it needed (tracemalloc, RSS high-water) and kept."""
    import tracemalloc
    gc.collect()
    before_tm = tracemalloc.get_traced_memory()[0]
    tracemalloc.reset_peak()
    before_rss = rss()
    hwm_ok = reset_hwm()
    t0 = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - t0
    hwm = _status("VmHWM") if hwm_ok else max(rss(), before_rss)
    cur, peak = tracemalloc.get_traced_memory()
    return {"tm_peak": peak - before_tm, "tm_kept": cur - before_tm,
            "rss_peak": hwm - before_rss, "seconds": seconds, "hwm_reset": hwm_ok,
            "result": result}


def memory_worker(comm, nbytes: int, algorithms) -> list[dict]:
    """Rank body: cold, warm and in-place allreduce per algorithm, measured on this rank."""
    import tracemalloc

    from coursekit.collectives import allreduce, hierarchical_allreduce

    n = nbytes // 4
    p = comm.size
    x = np.full(n, comm.rank + 1, np.float32)  # touched: resident before we measure
    want = np.float32(p * (p + 1) // 2)
    tracemalloc.start()
    rows = []
    for alg in algorithms:
        if hasattr(comm, "_collective_scratch"):
            del comm._collective_scratch  # a fresh comm for the cold call
        if alg == "hierarchical":
            def call(out=None):
                return hierarchical_allreduce(comm, x, ranks_per_node=2, check=False)
        else:
            def call(out=None, alg=alg):
                return allreduce(comm, x, algorithm=alg, check=False, out=out)
        row = {"algorithm": alg, "rank": comm.rank}
        for phase in ("cold", "warm", "inplace"):
            if phase == "inplace":
                if alg == "hierarchical":
                    continue
                x[...] = comm.rank + 1
            comm.barrier()
            m = _measure(lambda: call(x if phase == "inplace" else None))
            res = m.pop("result")
            row["ok_" + phase] = bool(res[0] == want and res[-1] == want)
            del res
            row[phase] = m
            gc.collect()
        x[...] = comm.rank + 1
        rows.append(row)
        comm.barrier()
    tracemalloc.stop()
    return rows


def section_memory(args) -> list[dict]:
    from coursekit.collectives import ALGORITHMS
    from coursekit.comm.procs import run_procs
    import bench_load

    algorithms = [*ALGORITHMS["allreduce"], "hierarchical"]
    sizes = [64 * MiB] if args.quick else [64 * MiB, 512 * MiB]
    rows = []
    for nbytes in sizes:
        # per rank: x, the result, a work array, a libzmq buffer; lg p more at a root
        fits = [p for p in (4, 2) if mem_available() > p * 4 * nbytes + 2 * nbytes + (1 << 30)]
        if not fits:
            print(f"\n(memory: skipped {nbytes // MiB} MiB: MemAvailable "
                  f"{mem_available() / 2**30:.1f} GiB is not enough for 2 ranks)")
            continue
        p = fits[0]
        out = run_procs(bench_load.memory_worker, p, nbytes, algorithms, timeout=600)
        for alg in algorithms:
            per_rank = [r for ranks in out for r in ranks if r["algorithm"] == alg]
            row = {"algorithm": alg, "p": p, "nbytes": nbytes, "ranks": per_rank}
            for phase in ("cold", "warm", "inplace"):
                ms = [r[phase] for r in per_rank if phase in r]
                if not ms:
                    continue
                row[phase] = {k: max(m[k] for m in ms) / nbytes
                              for k in ("tm_peak", "tm_kept", "rss_peak")}
                row[phase]["seconds"] = max(m["seconds"] for m in ms)
                row["ok_" + phase] = all(r["ok_" + phase] for r in per_rank)
            row["model"] = model(alg, p)
            rows.append(row)
    print("\n## Allreduce peak extra memory on p processes (ZmqComm), multiple of the "
          "array size n, max over ranks\n")
    print("tm = tracemalloc (NumPy arrays), RSS = VmHWM - RSS before; model = result + work "
          "arrays (NumPy; RSS adds the libzmq buffers in the last model column)\n")
    print("| size | p | algorithm | cold tm | cold RSS | warm tm | warm RSS | in-place tm "
          "| in-place RSS | kept | model tm cold / warm / in-place | + libzmq "
          "| tm over model (max) "
          "| warm s | correct |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        c, w, i, m = r.get("cold"), r.get("warm"), r.get("inplace"), r["model"]
        ip = f"{i['tm_peak']:.2f} | {i['rss_peak']:.2f}" if i else "- | -"
        mi = f" / {m['inplace']:.2f}" if "inplace" in m else ""
        ok = all(v for k, v in r.items() if k.startswith("ok_"))
        over = max(c["tm_peak"] - m["cold"], w["tm_peak"] - m["warm"],
                   i["tm_peak"] - m["inplace"] if i else 0.0)
        print(f"| {r['nbytes'] // MiB} MiB | {r['p']} | {r['algorithm']} | {c['tm_peak']:.2f} | "
              f"{c['rss_peak']:.2f} | {w['tm_peak']:.2f} | {w['rss_peak']:.2f} | {ip} | "
              f"{w['tm_kept']:.2f} | {m['cold']:.2f} / {m['warm']:.2f}{mi} | {m['tcp']:.2f} | "
              f"{over:+.2f}{' !' if over > 0.2 else ''} | {w['seconds']:.3f} | {ok} |")
    if rows:
        print("\nmodel: " + "; ".join(f"{a}: {MODEL[a][2]}" for a in MODEL))
        print("! = more than the model (by over 0.2 n). Before issue 29 every single-copy "
              "algorithm showed it: ZmqComm copied a single-copy (REMOTE) message that "
              "arrived while the rank waited for its own send's 'copied' notice into a fresh "
              "array at once, then again into out, so a rank whose peers ran ahead held one "
              "such message per step it was behind (64 MiB, 4 ranks: ring 1.5-1.8x cold "
              "against 1.25x). Now such a message is parked unread and copied once, into "
              "the out of the recv that takes it (zmq.py ZmqComm._park).")
    return rows


# ---- section 3: 8 engines on 2 cores -----------------------------------------------------------
def ranks_worker(comm, sizes, algorithms, repeats) -> list[dict]:
    """Rank body: per size and algorithm, per-call times (slowest rank) and correctness."""
    from coursekit.collectives import allreduce
    from coursekit.comm.trace import now

    p = comm.size
    rows = []
    for nbytes in sizes:
        x = np.full(nbytes // 4, comm.rank + 1, np.float32)
        want = np.float32(p * (p + 1) // 2)
        for alg in algorithms:
            ok = bool(np.all(allreduce(comm, x, algorithm=alg, check=False) == want))  # warm-up
            times = []
            for _ in range(repeats[str(nbytes)]):
                comm.barrier()
                t0 = now()
                res = allreduce(comm, x, algorithm=alg, check=False)
                times.append(now() - t0)
                ok = ok and bool(res[0] == want and res[-1] == want)
            slowest = allreduce(comm, np.array(times), op="max", check=False)
            all_ok = allreduce(comm, np.array([float(ok)]), op="min", check=False)[0] == 1.0
            rows.append({"nbytes": nbytes, "algorithm": alg, "times": slowest.tolist(),
                         "ok": bool(all_ok)})
    return rows


def section_ranks(args) -> list[dict]:
    from coursekit.comm.procs import run_procs
    from coursekit.costmodel import busbw
    import bench_load

    sizes = [1 * MiB, 16 * MiB]
    repeats = {str(1 * MiB): 10 if args.quick else 40, str(16 * MiB): 4 if args.quick else 15}
    algorithms = ["ring", "recursive_doubling"]
    rows = []
    for p in (2, 4, 8):
        t0 = time.perf_counter()
        try:
            out = run_procs(bench_load.ranks_worker, p, sizes, algorithms, repeats, timeout=120)
            error = None
        except Exception as exc:  # noqa: BLE001 - a failure is a result here
            out, error = None, f"{type(exc).__name__}: {exc}"
        wall = time.perf_counter() - t0
        if out is None:
            rows.append({"p": p, "error": error, "wall_s": wall})
            continue
        for r in out[0]:
            med = float(np.median(r["times"]))
            rows.append({"p": p, "nbytes": r["nbytes"], "algorithm": r["algorithm"],
                         "median_s": med, "min_s": float(np.min(r["times"])),
                         "max_s": float(np.max(r["times"])), "calls": len(r["times"]) + 1,
                         "busbw_gbs": busbw("allreduce", p, r["nbytes"], med) / 1e9,
                         "ok": r["ok"], "wall_s": wall, "times": r["times"]})
    print("\n## Allreduce on 2, 4 and 8 processes of a 2-core machine (ring is the default)\n")
    print("| p | size | algorithm | median ms | min ms | max ms | busbw GB/s | vs p=2 | calls ok "
          "| run wall s |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    base = {(r["nbytes"], r["algorithm"]): r["median_s"] for r in rows if r.get("p") == 2
            and "median_s" in r}
    for r in rows:
        if "error" in r:
            print(f"| {r['p']} | - | - | - | - | - | - | - | FAILED: {r['error'][:200]} | "
                  f"{r['wall_s']:.1f} |")
            continue
        ref = base.get((r["nbytes"], r["algorithm"]))
        rel = f"{r['median_s'] / ref:.1f}x" if ref else "-"
        print(f"| {r['p']} | {r['nbytes'] // MiB} MiB | {r['algorithm']} | "
              f"{r['median_s'] * 1e3:.2f} | {r['min_s'] * 1e3:.2f} | {r['max_s'] * 1e3:.2f} | "
              f"{r['busbw_gbs']:.2f} | {rel} | {r['calls']}/{r['calls']} "
              f"{'yes' if r['ok'] else 'NO'} | {r['wall_s']:.1f} |")
    return rows


# ---- section 4: a long asynchronous parameter-server run ---------------------------------------
def ps_rank(comm, cfg, data):
    """Rank body: one rank of ``train_ps``, plus how long its trace got."""
    from coursekit.parallel.param_server import train_ps
    report = train_ps(comm, cfg, data)
    trace = comm.trace
    return report, len(trace), getattr(trace, "dropped", 0) if comm.tracing else 0


def _step_ms(ts, steps, lo: float, hi: float) -> float:
    """Milliseconds per step between the fractions ``lo`` and ``hi`` of the run's steps: the
    least-squares slope of time against the slowest worker's step in that window."""
    ts, steps = np.asarray(ts, float), np.asarray(steps, float)
    keep = (steps >= lo * steps[-1]) & (steps <= hi * steps[-1])
    if keep.sum() < 3 or np.ptp(steps[keep]) == 0:
        return float("nan")
    return float(np.polyfit(steps[keep], ts[keep], 1)[0]) * 1e3


def _bytes_per_step(steps, mem, lo: float, hi: float) -> float:
    """RSS growth per step between the fractions ``lo`` and ``hi`` of the run's steps."""
    steps, mem = np.asarray(steps, float), np.asarray(mem, float)
    keep = (steps >= lo * steps[-1]) & (steps <= hi * steps[-1])
    if keep.sum() < 3 or np.ptp(steps[keep]) == 0:
        return float("nan")
    return float(np.polyfit(steps[keep], mem[keep], 1)[0])


def _slowest_step(data: list[dict]) -> int:
    """The smallest step the workers published (the shard publishes none)."""
    return min((int(d["step"]) for d in data if "step" in d), default=0)


def section_async(args) -> dict:
    from coursekit.data import load_digits
    from coursekit.parallel.param_server.async_sgd import PSConfig, PSTopology, collect, train
    from coursekit.cluster.runner import LocalRunner

    duration = 15.0 if args.quick else args.async_seconds
    data = load_digits()
    base = dict(model="ssp", staleness=2, eval_every=args.async_eval_every)
    topology = PSTopology(servers=1, workers=3)
    threads = LocalRunner(topology.n_ranks)  # train_ps takes every rank: 1 shard, 3 workers
    train(threads, PSConfig(**base, steps=20), data)  # warm-up: imports, Numba kernels
    t0 = time.perf_counter()
    train(threads, PSConfig(**base, steps=2000), data)
    calibrated = (time.perf_counter() - t0) / 2000
    steps = max(100, int(duration / calibrated))  # other jobs on the machine stretch it
    cfg = PSConfig(**base, steps=steps, timeout=max(60.0, 4 * duration))
    gc.collect()
    start = {"rss": rss(), "fds": open_fds(), "threads": threading.active_count()}
    samples = []
    t0 = time.perf_counter()
    run = LocalRunner(topology.n_ranks, comm_timeout=cfg.timeout).start(ps_rank, cfg, data)
    interval = 0.25 if args.quick else 1.0
    while not run.ready():
        samples.append((time.perf_counter() - t0, rss(), open_fds(), threading.active_count(),
                        _slowest_step(run.data), time.process_time()))
        run.wait(interval)
    seconds = time.perf_counter() - t0
    outputs = run.get()
    result = collect(cfg, topology, [o[0] for o in outputs])
    traces = [(o[1], o[2]) for o in outputs]
    del run, outputs
    gc.collect()
    end = {"rss": rss(), "fds": open_fds(), "threads": threading.active_count()}
    ts, mem, fds, thr, done, cpu = (np.array(v, float) for v in zip(*samples))
    half = ts >= ts[-1] / 2
    slope = float(np.polyfit(ts[half], mem[half], 1)[0]) * 60 / MiB if half.sum() >= 2 else 0.0
    per_step = slope / 60 * MiB / (steps / seconds) if seconds else float("nan")
    # the start excludes the first 5% (warm-up: allocations every run makes once)
    windows = {"start": (0.05, 0.25), "end": (0.75, 1.0)}
    step_ms = {k: _step_ms(ts, done, *w) for k, w in windows.items()}
    # CPU seconds of this process (all ranks) per step: what other jobs on the machine
    # change least, so an O(steps) cost per step shows even when the wall clock is noisy
    cpu_ms = {k: _step_ms(cpu, done, *w) for k, w in windows.items()}
    growth = {k: _bytes_per_step(done, mem, *w) for k, w in windows.items()}
    workers = [w for w in result.workers if w is not None]
    kept = {"spans per worker": max(len(w.spans) for w in workers),
            "spans dropped": max(getattr(w.spans, "dropped", 0) for w in workers),
            "curve points": max(len(w.curve_t) for w in workers) if workers else 0,
            "staleness records": max(len(s.staleness) for s in result.servers)}
    row = {"steps": steps, "workers": topology.workers, "seconds": seconds,
           "eval_every": cfg.eval_every, "step_ms": step_ms, "cpu_ms_per_step": cpu_ms,
           "rss_bytes_per_step": growth,
           "rss_bytes_per_step_second_half": per_step, "kept": kept,
           "calibrated_s_per_step": calibrated, "start": start, "end": end,
           "rss_peak_mib": float(mem.max()) / MiB,
           "rss_slope_mib_per_min_second_half": slope,
           "fds_max": int(fds.max()), "threads_max": int(thr.max()),
           "trace_len_and_dropped": traces,
           "statuses": [w.status for w in workers],
           "samples": samples}
    print(f"\n## Async parameter server (SSP s=2, 1 shard + 3 workers, ThreadComm, "
          f"eval_every {cfg.eval_every}), {steps} steps in {seconds:.1f} s\n")
    print("| t s | slowest worker's step | RSS MiB | open fds | threads |")
    print("|---|---|---|---|---|")
    shown = samples[:: max(1, len(samples) // 10)]
    for t, m, f, n, k, _ in shown + ([samples[-1]] if shown[-1] is not samples[-1] else []):
        print(f"| {t:.1f} | {int(k)} | {m / MiB:.1f} | {f} | {n} |")
    print("\n| steps of the run | ms per step (wall) | CPU ms per step (all ranks) "
          "| RSS bytes per step |")
    print("|---|---|---|---|")
    for k, (lo, hi) in windows.items():
        print(f"| {k}: {lo:.0%} - {hi:.0%} | {step_ms[k]:.3f} | {cpu_ms[k]:.3f} "
              f"| {growth[k]:.0f} |")
    print(f"\nstart: RSS {start['rss'] / MiB:.1f} MiB, {start['fds']} fds, {start['threads']} "
          f"threads; end (after the run, gc): RSS {end['rss'] / MiB:.1f} MiB, {end['fds']} fds, "
          f"{end['threads']} threads; peak RSS {row['rss_peak_mib']:.1f} MiB; RSS slope over "
          f"the second half {slope:.2f} MiB/min ({per_step:.0f} B per step); records kept "
          f"{kept}; trace (len, dropped) per rank {traces}; workers: {row['statuses']}")
    return row


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="under 2 minutes: fewer messages, 64 MiB only, a 15 s async run")
    parser.add_argument("--only", nargs="+", choices=SECTIONS, default=list(SECTIONS))
    parser.add_argument("--async-seconds", type=float, default=120.0,
                        help="length of the async run without --quick (default 120)")
    parser.add_argument("--async-eval-every", type=int, default=10,
                        help="the async run's snapshot interval in steps (default 10, "
                             "chapter 4's)")
    parser.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # spawned ranks import bench_load
    results = {"quick": args.quick, "cpus": os.cpu_count(),
               "load_average": os.getloadavg()}
    t0 = time.perf_counter()
    for name in args.only:
        t1 = time.perf_counter()
        results[name] = globals()["section_" + name](args)
        print(f"\n({name}: {time.perf_counter() - t1:.1f} s)", flush=True)
    results["wall_s"] = time.perf_counter() - t0
    results["load_average_end"] = os.getloadavg()
    print(f"\ntotal {results['wall_s']:.1f} s; load average {results['load_average']} -> "
          f"{results['load_average_end']} on {results['cpus']} CPUs (timings are noisy)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1, default=float)


if __name__ == "__main__":
    main()
