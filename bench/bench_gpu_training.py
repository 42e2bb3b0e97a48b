"""Chapter 3's synchronous data-parallel training on a GPU and on the CPU, in one run.

    python bench/bench_gpu_training.py [--steps 40] [--devices cuda cpu] [--json FILE] [--require-gpu]

Starts a local cluster of 4 engines (ZmqComm between them) that all share this machine's
GPU(s) (engine i drives GPU i % n_gpus: ``coursekit.nn.kernels_cuda.bind_engine_gpu``),
and trains with ring-allreduce data parallelism, ``DPConfig(device="cuda")`` then
``DPConfig(device="cpu")``, on two networks:

* 784-256-10, global batch 256 (64 rows per engine), Gaussian blobs;
* 64-128-10, global batch 128 (32 per engine, chapter 1's batch), scikit-learn's digits.

Each run is warmed up (kernels compiled on every engine) and then timed over ``--steps``
steps. Per step it reports, from the ranks' spans (``DPResult.spans``):

* step: the slowest rank's step time (mean over the timed steps);
* compute: forward + backward + optimizer (span kinds ``COMPUTE_KINDS``), slowest rank;
* stage: host <-> device copies (span kind "stage"), slowest rank; zero on the CPU;
* comm: the gradient allreduce (span kinds "comm", "send"), the rank that waited least
  (the last to arrive waits for nobody, so its exchange time is the communication itself);
* other: what is left (waiting for late ranks, Python between the spans);
* stage share: stage / step, the part of a step the GPU run spends moving the flat
  buffers between host and device (in chapter 3 the gradient is allreduced on the host).

The numbers are measured side by side in one run and printed as a markdown table;
``--json`` saves them for ``bench/gpu_report.py`` (``make test-gpu``). ``--require-gpu``
(and ``--devices cuda``) exits with a clear message when numba finds no GPU, or when this
coursekit's DPConfig has no ``device`` field yet.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass

import numpy as np

COMM_KINDS = ("comm", "send")
STAGE_KIND = "stage"


@dataclass(frozen=True)
class Net:
    """One network of the bench: its sizes, global batch and data set."""

    name: str
    sizes: tuple
    batch_size: int
    data: str  # "digits" or "blobs"


NETS = (
    Net("784-256-10", (784, 256, 10), 256, "blobs"),
    Net("64-128-10 digits", (64, 128, 10), 128, "digits"),
)


def no_gpu_reason() -> str | None:
    """Why the cuda half cannot run here (None when it can)."""
    try:
        from numba import cuda

        if not cuda.is_available():
            return "numba finds no usable CUDA GPU"
    except Exception as e:  # noqa: BLE001 - a broken CUDA install is a reason too
        return f"numba.cuda failed to load: {e}"
    from coursekit.parallel.data_parallel import DPConfig

    if "device" not in DPConfig.__dataclass_fields__:
        return ("this coursekit's DPConfig has no `device` field yet (chapter 3 on the GPU, "
                "issue 27)")
    return None


def make_config(net: Net, device: str, steps: int, **overrides):
    """The DPConfig of one run; ``device`` is passed only when it is not "cpu", so the CPU
    half also runs on a coursekit whose DPConfig has no ``device`` field yet."""
    from coursekit.parallel.data_parallel import DPConfig

    kw = dict(sizes=net.sizes, batch_size=net.batch_size, epochs=1000, max_steps=steps,
              lr=0.01, timeline_steps=steps, publish_interval=0.0, **overrides)
    if device != "cpu" or "device" in DPConfig.__dataclass_fields__:
        kw["device"] = device
    return DPConfig(**kw)


def load_data(net: Net, rows: int | None = None):
    """(X_train, y_train) for ``net`` (``rows``: at most that many rows)."""
    from coursekit.data import load_digits, make_classification

    if net.data == "digits":
        d = load_digits()
    else:
        d = make_classification(max(4 * net.batch_size, 2048), net.sizes[0], net.sizes[-1], seed=0)
    X, y = d.X_train, d.y_train
    return (X[:rows], y[:rows]) if rows else (X, y)


def breakdown(result) -> dict:
    """Per-step seconds of one run from its spans (see the module docstring), and the
    stage share. Spans are summed per rank over the timeline's steps, then divided by
    the number of those steps."""
    steps = min(result.config.timeline_steps, result.step_s.shape[1])
    if steps < 1:
        raise ValueError("the run kept no timeline steps (timeline_steps=0)")
    n = result.n_workers
    per_rank = {kind: np.zeros(n) for kind in ("compute", "stage", "comm", "idle")}
    from coursekit.parallel.spans import COMPUTE_KINDS

    for s in result.spans:
        if s.kind in COMPUTE_KINDS:
            per_rank["compute"][s.rank] += s.duration
        elif s.kind == STAGE_KIND:
            per_rank["stage"][s.rank] += s.duration
        elif s.kind in COMM_KINDS:
            per_rank["comm"][s.rank] += s.duration
        else:
            per_rank["idle"][s.rank] += s.duration
    step = float(result.step_s[:, -steps:].max(axis=0).mean())
    compute = float(per_rank["compute"].max() / steps)
    stage = float(per_rank["stage"].max() / steps)
    comm = float(per_rank["comm"].min() / steps)
    return {"steps": int(steps), "workers": int(n), "step_s": step, "compute_s": compute,
            "stage_s": stage, "comm_s": comm, "other_s": step - compute - stage - comm,
            "stage_share": stage / step if step > 0 else float("nan"),
            "stage_spans": int(sum(s.kind == STAGE_KIND for s in result.spans))}


def measure(runner, net: Net, device: str, steps: int, *, warmup: int = 3, data=None) -> dict:
    """Warm up, then time ``steps`` steps of ``net`` on ``device``; the breakdown plus the
    run's description."""
    from coursekit.parallel.data_parallel import train

    data = load_data(net) if data is None else data
    train(runner, make_config(net, device, warmup), data)  # compiles the kernels on every rank
    result = train(runner, make_config(net, device, steps), data)
    row = {"net": net.name, "sizes": list(net.sizes), "batch_size": net.batch_size,
           "device": device, **breakdown(result)}
    ran_on = getattr(result, "devices", None)  # where each rank computed, when recorded
    if ran_on is not None and any(d.split(":")[0] != device for d in ran_on):
        raise RuntimeError(f"asked for device={device!r} but the ranks computed on {ran_on}")
    if device != "cpu" and row["stage_spans"] == 0:
        raise RuntimeError(f"the {device} run of {net.name} recorded no 'stage' span: the "
                           "data-parallel worker does not time its host <-> device copies")
    return row


def markdown(rows: list[dict]) -> str:
    """The rows as a markdown table (times in ms per step)."""
    head = ("| network | batch | device | step ms | compute ms | stage ms | comm ms | other ms "
            "| stage share |\n|---|---|---|---|---|---|---|---|---|\n")
    ms = lambda s: f"{s * 1e3:.3f}"  # noqa: E731
    return head + "".join(
        f"| {r['net']} | {r['batch_size']} | {r['device']} | {ms(r['step_s'])} | "
        f"{ms(r['compute_s'])} | {ms(r['stage_s'])} | {ms(r['comm_s'])} | {ms(r['other_s'])} | "
        f"{100 * r['stage_share']:.1f} % |\n" for r in rows)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--engines", type=int, default=4)
    parser.add_argument("--devices", nargs="+", choices=("cuda", "cpu"), default=["cuda", "cpu"])
    parser.add_argument("--nets", nargs="+", type=int, default=list(range(len(NETS))),
                        help="indices into NETS (0: 784-256-10, 1: 64-128-10 digits)")
    parser.add_argument("--json", metavar="FILE", help="also save the rows as JSON")
    parser.add_argument("--require-gpu", action="store_true",
                        help="fail when the cuda half cannot run (instead of skipping it)")
    args = parser.parse_args(argv)

    devices = list(args.devices)
    if "cuda" in devices or args.require_gpu:
        reason = no_gpu_reason()
        if reason is not None:
            if args.require_gpu or devices == ["cuda"]:
                print(f"bench_gpu_training: cannot run the cuda half: {reason}. "
                      "Run it on a machine with an NVIDIA GPU (make test-gpu), or pass "
                      "--devices cpu for the CPU half alone.", file=sys.stderr)
                return 2
            print(f"bench_gpu_training: skipping the cuda half: {reason}", file=sys.stderr)
            devices.remove("cuda")

    from coursekit import cluster
    from coursekit.cluster.runner import ClusterRunner
    from coursekit.comm import setup_comm

    rows = []
    with cluster.start(n=args.engines) as c:
        setup_comm(c, timeout=60)
        runner = ClusterRunner(c)
        gpus = None
        if "cuda" in devices:
            gpus = sorted(set(c.run(_engine_gpu)))
        for i in args.nets:
            net = NETS[i]
            data = load_data(net)
            for device in devices:
                row = measure(runner, net, device, args.steps, data=data)
                print(f"{net.name} {device}: {row['step_s'] * 1e3:.3f} ms/step", flush=True)
                rows.append(row)
    print()
    print(f"{args.engines} engines on one machine" + (f", GPUs used {gpus}" if gpus else ""))
    print(markdown(rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"bench": "gpu_training", "engines": args.engines, "steps": args.steps,
                       "gpus_used": gpus, "nets": [asdict(NETS[i]) for i in args.nets],
                       "rows": rows}, f, indent=2)
    return 0


def _engine_gpu():
    """On an engine: the GPU id it drives (after binding it, as the worker will)."""
    from coursekit.nn.kernels_cuda import bind_engine_gpu

    return bind_engine_gpu()


if __name__ == "__main__":
    sys.exit(main())
