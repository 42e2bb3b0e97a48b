"""Check a cluster before a class uses it: ``coursekit preflight [--cluster SPEC]``.

Attaches to the cluster (``--cluster`` as for :func:`coursekit.cluster.connect`, default
``$COURSEKIT_CLUSTER``), then reports engines, hosts, GPUs per engine, the Comm backend and
alpha/beta measured between engines (ping-pong, rank 0 to a rank on the same host and, if
there is one, on another host). Per engine it says which GPU the training chapters will
use (local rank % the GPUs numba sees, :mod:`coursekit.cluster.gpu_probe`) and whether numba
compiled and ran a test kernel there, or why there is no GPU. It fails (exit status 1)
with a fix-it message when:

* the controller listens on loopback only but engines are expected on several nodes;
* fewer hosts than ``--nodes`` have engines;
* ``--gpus-per-engine N`` was asked for and some engine sees fewer GPUs (numba's count, or
  ``nvidia-smi``'s where numba sees fewer: a GPU numba cannot use still fails the next check);
* an engine sees a GPU but the test kernel failed there (no driver for numba, wrong result ...): the error text is in the report;
* ``--mpi`` was asked for and the engines are not MPI ranks or mpi4py / mpiexec is missing;
* the engines cannot build a Comm (e.g. ZMQ bound to an interface other hosts cannot reach).
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field

from coursekit import checks
from coursekit.cluster import MPI_LAUNCHER_VARIABLES, gpu_probe

__all__ = ["Check", "Report", "engine_facts", "gpu_kernel_check", "main", "run_preflight"]


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str
    fix: str = ""


@dataclass
class Report:
    """What :func:`run_preflight` found. ``links``: name -> (alpha s, beta s/B);
    ``gpu``: each engine's :func:`coursekit.cluster.gpu_probe.probe` answer."""

    engines: int
    hosts: dict
    gpus: list
    backend: str
    controller: str
    links: dict = field(default_factory=dict)
    checks: list = field(default_factory=list)
    gpu: list = field(default_factory=list)
    engine_hosts: list = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def text(self) -> str:
        lines = [f"engines: {self.engines} on {len(self.hosts)} host(s): "
                 + ", ".join(f"{h} ({n})" for h, n in self.hosts.items()),
                 f"controller: {self.controller}",
                 f"GPUs per engine: {self.gpus}"]
        lines += [f"engine {r} ({host}): {gpu_probe.describe(g)}"
                  for r, (host, g) in enumerate(zip(self.engine_hosts, self.gpu))]
        lines.append(f"Comm backend: {self.backend}")
        for name, (alpha, beta) in self.links.items():
            lines.append(f"link {name}: alpha = {alpha * 1e6:.1f} us, "
                         f"bandwidth = {1 / beta / 1e9:.2f} GB/s")
        for c in self.checks:
            lines.append(f"[{'ok' if c.ok else 'FAIL'}] {c.name}: {c.detail}")
            if not c.ok and c.fix:
                lines.append(f"       fix: {c.fix}")
        lines.append("preflight passed" if self.ok else "preflight FAILED")
        return "\n".join(lines)


def _gpu_count() -> int:
    """GPUs this process may use: nvidia-smi's list, narrowed by CUDA_VISIBLE_DEVICES."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return 0
    try:
        listed = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return 0
    n = sum(1 for line in listed.stdout.splitlines() if line.startswith("GPU "))
    if visible is None:
        return n
    ids = [v for v in visible.split(",") if v.strip() not in ("", "-1")]
    return min(n, len(ids))


def _mpi_library() -> str:
    """Runs on an engine: "mpi4py" and its MPI library's name, "" where mpi4py is missing.

    MPI is initialized (``mpi4py.MPI`` imported) only in a process an MPI launcher started,
    as :func:`coursekit.cluster._probe_engine` does: in any other engine it would start an
    MPI singleton, whose segment in /dev/shm outlives the engine."""
    try:
        import mpi4py
    except ImportError:
        return ""
    if not any(name in os.environ for name in MPI_LAUNCHER_VARIABLES):
        return f"mpi4py {mpi4py.__version__} (this engine is not an MPI rank)"
    from mpi4py import MPI
    return f"mpi4py {MPI.Get_library_version().splitlines()[0][:40]}"


def engine_facts() -> dict:
    """Runs on an engine: host, GPUs, CUDA_VISIBLE_DEVICES, MPI availability, and the
    GPU probe (:func:`coursekit.cluster.gpu_probe.probe`: which GPU, does a kernel run)."""
    gpu = gpu_probe.probe()
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "gpus": max(_gpu_count(), gpu["gpus"]), "gpu": gpu,
            "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "mpi": _mpi_library(),
            "mpiexec": bool(shutil.which("mpiexec") or
                            os.path.exists(os.path.join(sys.prefix, "bin", "mpiexec")))}


def _controller(cluster) -> str:
    return getattr(cluster.client, "_config", {}).get("interface", "unknown")


def _is_loopback(url: str) -> bool:
    host = url.split("://")[-1].split(":")[0]
    return host.startswith("127.") or host in ("localhost", "::1")


def _link(cluster, a: int, b: int, repeats: int):
    from coursekit import measure
    from coursekit.cluster.runner import ClusterRunner

    f = measure.link(ClusterRunner(cluster), "pingpong", repeats=repeats, a=a, b=b)
    return f.alpha, f.beta


def gpu_kernel_check(facts: list) -> Check | None:
    """The "gpu kernel" Check: the test kernel ran right on every engine that sees a GPU
    (by numba's count or nvidia-smi's); None when no engine has one (a CPU cluster:
    nothing to check; too few GPUs is the "gpus" check's)."""
    probes = [(r, f["gpu"]) for r, f in enumerate(facts) if f["gpus"]]
    if not probes:
        return None
    bad = [(r, g) for r, g in probes if g["kernel"] != "ok"]
    if not bad:
        return Check("gpu kernel", True, f"numba ran a test kernel on the GPU of all "
                     f"{len(probes)} engine(s) with one")
    return Check("gpu kernel", False, f"{len(bad)} engine(s) cannot run a CUDA kernel: "
                 + "; ".join(f"rank {r}: {gpu_probe.describe(g)}" for r, g in bad[:4]),
                 "install the CUDA driver / toolkit numba needs in the engines' environment "
                 "(`python -c 'from numba import cuda; cuda.detect()'` on the host says what "
                 "is missing; NUMBA_CUDA_DRIVER names a driver library elsewhere), and give "
                 "each engine its GPU (CUDA_VISIBLE_DEVICES=$SLURM_LOCALID per task)")


def run_preflight(cluster, *, gpus_per_engine: int = 0, mpi: bool = False,
                  nodes: int | None = None, interface: str | None = None,
                  repeats: int = 5) -> Report:
    """Check an attached :class:`~coursekit.cluster.CourseCluster`; return the Report."""
    checks.cluster(cluster)
    checks.boolean(mpi, "mpi")
    from coursekit.comm import setup_comm, teardown_comm

    facts = cluster.run(engine_facts)
    hosts = dict(Counter(f["host"] for f in facts))
    controller = _controller(cluster)
    report = Report(cluster.size, hosts, [f["gpus"] for f in facts], "none", controller,
                    gpu=[f["gpu"] for f in facts], engine_hosts=[f["host"] for f in facts])
    add = report.checks.append
    want_nodes = nodes if nodes is not None else len(hosts)
    if _is_loopback(controller) and want_nodes > 1:
        add(Check("controller", False, f"listens on {controller} (loopback only), but engines "
                  f"on {want_nodes} nodes must reach it",
                  "set c.Cluster.controller_ip = '*' in the profile's ipcluster_config.py "
                  "(or `ipcontroller --ip='*'`) and restart the cluster"))
    else:
        add(Check("controller", True, f"listens on {controller}"
                  + (" (only engines on this machine can connect)"
                     if _is_loopback(controller) else "")))
    if nodes is not None:
        add(Check("nodes", len(hosts) >= nodes, f"engines on {len(hosts)} of {nodes} expected "
                  "hosts", "engines did not start on every node: look at the engine job's log "
                  "(profile_dir/log) and at `squeue`; check that the compute nodes reach the "
                  "controller's address"))
    if gpus_per_engine:
        short = [(r, f) for r, f in enumerate(facts) if f["gpus"] < gpus_per_engine]
        add(Check("gpus", not short,
                  f"every engine sees >= {gpus_per_engine} GPU(s)" if not short else
                  f"{len(short)} engine(s) see fewer than the {gpus_per_engine} GPU(s) asked "
                  "for: " + "; ".join(f"rank {r} on {f['host']}: {f['gpus']}"
                                      + ("" if f["gpus"] else
                                         f" ({gpu_probe.describe(f['gpu'])})")
                                      for r, f in short[:6]),
                  "start the engines on a GPU partition with the Slurm profile "
                  "(`--gres=gpu:N`, CUDA_VISIBLE_DEVICES=$SLURM_LOCALID per task) and check "
                  "`nvidia-smi` on those hosts"))
    kernel = gpu_kernel_check(facts)
    if kernel is not None:
        add(kernel)
    if mpi:
        missing = [r for r, f in enumerate(facts) if not f["mpi"]]
        if missing:
            add(Check("mpi", False, f"mpi4py is missing on ranks {missing[:8]}",
                      "pip install mpi4py mpich in the engines' environment"))
        elif not cluster.mpi:
            add(Check("mpi", False, "the engines are not MPI ranks",
                      "start them with mpiexec: the MPI profile (`coursekit profiles "
                      "mpi ...`) or `ipcluster start --engines=mpi`"))
        else:
            add(Check("mpi", True, f"{cluster.size} MPI ranks ({facts[0]['mpi']})"))
    if len(hosts) > 1 and not cluster.mpi and interface is not None and _is_loopback(interface):
        add(Check("comm", False, f"ZMQ would bind to {interface} on {len(hosts)} hosts",
                  "pass --interface with a network interface every host has (e.g. eth0, ib0)"))
        return report
    try:
        report.backend = setup_comm(cluster, interface=interface)
    except Exception as exc:  # noqa: BLE001 - reported as a failed check with its message
        add(Check("comm", False, f"building a Comm failed: {exc}",
                  "check --interface and that engines can open TCP ports to each other"))
        return report
    try:
        add(Check("comm", True, f"{report.backend} between all {cluster.size} engines"))
        ranks_by_host = {}
        for r, f in enumerate(facts):
            ranks_by_host.setdefault(f["host"], []).append(r)
        same = [r for r in ranks_by_host[facts[0]["host"]] if r != 0]
        other = [rs[0] for h, rs in ranks_by_host.items() if h != facts[0]["host"]]
        if same:
            report.links["intra-host"] = _link(cluster, 0, same[0], repeats)
        if other:
            report.links["inter-host"] = _link(cluster, 0, other[0], repeats)
    finally:
        teardown_comm(cluster)
    return report


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="coursekit preflight", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--cluster", default=None,
                        help="PROFILE, PROFILE:CLUSTER_ID or ipcontroller-client.json "
                             "(default: $COURSEKIT_CLUSTER)")
    parser.add_argument("--engines", type=int, default=1, help="wait for this many engines")
    parser.add_argument("--gpus-per-engine", type=int, default=0)
    parser.add_argument("--mpi", action="store_true", help="engines must be MPI ranks")
    parser.add_argument("--nodes", type=int, default=None, help="hosts that must have engines")
    parser.add_argument("--interface", default=None,
                        help="where ZMQ engines bind (default: loopback on one host, else the "
                             "address each engine reaches the controller from; or e.g. eth0)")
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args(argv)
    from coursekit import cluster as ck

    spec = args.cluster if args.cluster is not None else os.environ.get(ck.ENV_CLUSTER, "")
    if not spec:
        print("error: no cluster named: pass --cluster PROFILE (or a path to "
              "ipcontroller-client.json) or set COURSEKIT_CLUSTER", file=sys.stderr)
        return 2
    try:
        c = ck.connect(spec, n=args.engines, timeout=args.timeout)
    except ck.ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    try:
        report = run_preflight(c, gpus_per_engine=args.gpus_per_engine, mpi=args.mpi,
                               nodes=args.nodes, interface=args.interface)
    finally:
        c.stop()  # attached: only disconnects
    print(report.text())
    return 0 if report.ok else 1


if __name__ == "__main__":
    # Run the importable module's main: functions sent to engines must come from
    # coursekit.cluster.preflight, not from __main__ (which the engines cannot import).
    from coursekit.cluster.preflight import main as _main

    sys.exit(_main())
