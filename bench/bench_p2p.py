"""Point-to-point benchmark: coursekit's Comm backends against the raw libraries, one run.

    python bench/bench_p2p.py            # ZMQ (2 spawned processes) and MPI (mpiexec -n 2)

ZmqComm runs twice: with its shared-memory lanes (its default between processes of one
host, ``coursekit.comm.shm``) and over TCP only (``shared_memory=False``); both receive into
a preallocated buffer (``recv(out=)``), as mpi4py's ``Recv`` does. The physical limit is
printed beside them: a single-thread memcpy of the same bytes between two warm buffers.
Targets (issue 30): ZmqComm with lanes one-way 8 B <= 5 us and 64 MB >= 50 % of mpi4py's
bandwidth; MpiComm <= 2x mpi4py at 8 B and <= 1.3x at 64 MB.

One-way time = ping-pong round trip / 2 between two processes on this machine, for
8 B (latency), 1 KB, 1 MB and 64 MB messages; bandwidth = bytes / one-way time.
Raw pyzmq uses the very PUSH/PULL sockets ZmqComm uses (zero-copy above 64 KB, like
ZmqComm); raw mpi4py uses Send/Recv on NumPy buffers. Each number is the best of
REPEATS blocks run alternately (raw, ours, raw, ours, ...) so machine noise hits both.
Target: ZmqComm small-message latency <= 1.3x raw pyzmq.

Authentication cost: ZmqComm seals every message (a MAC + sequence number, see
coursekit.comm.auth); the "no auth" column runs the same ping-pong with both ranks'
sealers swapped for a pass-through, in the same alternating blocks.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SIZES = {"8 B": 8, "1 KB": 1 << 10, "1 MB": 1 << 20, "64 MB": 64 << 20}
ITERS = {"8 B": 2000, "1 KB": 1000, "1 MB": 100, "64 MB": 4}
REPEATS = 5


def _best(blocks: dict, repeats: int) -> dict:
    """Run each named block ``repeats`` times, alternating; keep the minimum per name."""
    best = {name: float("inf") for name in blocks}
    for _ in range(repeats):
        for name, block in blocks.items():
            best[name] = min(best[name], block())
    return best


def _raw_zmq(comm, nbytes: int, iters: int) -> float:
    import zmq
    peer = 1 - comm.rank
    push, pull = comm._push[peer], comm._pull
    msg = np.zeros(nbytes, np.uint8)
    big = nbytes > 65536
    t0 = time.perf_counter()
    for _ in range(iters):
        if comm.rank == 0:
            push.send(msg, copy=not big)
            pull.recv(copy=False)
        else:
            pull.recv(copy=False)
            push.send(msg, copy=not big)
    del zmq
    return (time.perf_counter() - t0) / iters / 2


class _NoAuth:
    """A pass-through in place of a comm's FrameSealer: the cost of authentication is
    the difference (this bench only; frames then carry no trailer)."""

    @staticmethod
    def seal(body, dest):
        return body

    @staticmethod
    def open(frame, sender):
        return frame


def _unauthenticated(comm, block) -> float:
    sealer, comm._sealer = comm._sealer, _NoAuth
    try:
        return block()
    finally:
        comm._sealer = sealer


def zmq_worker(comm) -> dict:
    """Runs on both spawned ranks; returns {size: {"raw": s, "coursekit": s, "no auth": s}}
    ("no auth" only over TCP: lane records are not sealed)."""
    from coursekit.comm.examples import ping_pong
    out = {}
    for name, nbytes in SIZES.items():
        iters = ITERS[name] * (5 if nbytes < 4096 and comm.shared_memory_peers else 1)
        _raw_zmq(comm, nbytes, 2)

        def ours():
            return ping_pong(comm, nbytes, iters, warmup=2, out=True)
        blocks = {"raw": lambda: _raw_zmq(comm, nbytes, iters), "coursekit": ours}
        if not comm.shared_memory_peers:
            blocks["no auth"] = lambda: _unauthenticated(comm, ours)
        out[name] = _best(blocks, REPEATS)
    return out


def memcpy_seconds(nbytes: int, repeats: int = REPEATS) -> float:
    """Best time of one single-thread copy of ``nbytes`` between two warm buffers."""
    src, dst = np.ones(nbytes, np.uint8), np.zeros(nbytes, np.uint8)
    np.copyto(dst, src)
    best = float("inf")
    for _ in range(repeats * 2):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return best


def _raw_mpi(comm, nbytes: int, iters: int) -> float:
    from mpi4py import MPI
    world = MPI.COMM_WORLD
    peer = 1 - world.rank
    msg, buf = np.zeros(nbytes, np.uint8), np.empty(nbytes, np.uint8)
    t0 = time.perf_counter()
    for _ in range(iters):
        if world.rank == 0:
            world.Send(msg, peer)
            world.Recv(buf, peer)
        else:
            world.Recv(buf, peer)
            world.Send(msg, peer)
    return (time.perf_counter() - t0) / iters / 2


def _copied_sends(comm, block) -> float:
    """``block`` with every large plain send copying its payload first (SYNC_MIN out of
    reach): MpiComm's cost before sends went straight from the array to a waiting receiver."""
    from coursekit.comm import mpi
    sync_min, mpi.SYNC_MIN = mpi.SYNC_MIN, float("inf")
    try:
        return block()
    finally:
        mpi.SYNC_MIN = sync_min


def _memcpy(nbytes: int, iters: int) -> float:
    """Seconds for one memcpy of ``nbytes`` between two warm buffers (on rank 0, while
    rank 1 waits): what a buffered send's copy costs, and the machine's copy bandwidth."""
    src, dst = np.ones(nbytes, np.uint8), np.empty(nbytes, np.uint8)
    np.copyto(dst, src)
    t0 = time.perf_counter()
    for _ in range(iters):
        np.copyto(dst, src)
    return (time.perf_counter() - t0) / iters


def mpi_main() -> None:
    """``mpiexec -n 2 python bench_p2p.py --mpi``: prints one JSON line on rank 0."""
    from coursekit.comm.examples import ping_pong
    from coursekit.comm.mpi import MpiComm
    comm = MpiComm(timeout=120)
    out = {}
    for name, nbytes in SIZES.items():
        iters = ITERS[name] * (5 if nbytes < 4096 else 1)
        _raw_mpi(comm, nbytes, 2)
        out[name] = _best({"raw": lambda: _raw_mpi(comm, nbytes, iters),
                           "coursekit": lambda: ping_pong(comm, nbytes, iters, warmup=2)},
                          REPEATS)
    big, iters = SIZES["64 MB"], ITERS["64 MB"]
    out["breakdown"] = _best({  # where MpiComm's 64 MB one-way time goes
        "raw": lambda: _raw_mpi(comm, big, iters),
        "coursekit": lambda: ping_pong(comm, big, iters, warmup=1),
        "copied": lambda: _copied_sends(comm, lambda: ping_pong(comm, big, iters, warmup=1)),
        "memcpy": lambda: _memcpy(big, iters) if comm.rank == 0 else 0.0}, REPEATS)
    if comm.rank == 0:
        print(json.dumps(out), flush=True)
    comm.close()


def run_mpi() -> dict | None:
    mpiexec = Path(sys.executable).parent / "mpiexec"
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return None
    proc = subprocess.run([str(mpiexec), "-n", "2", sys.executable, __file__, "--mpi"],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if proc.returncode:
        print(proc.stdout, proc.stderr, file=sys.stderr)
        return None
    return json.loads(proc.stdout.strip().splitlines()[-1])


def table(title: str, res: dict, lib: str) -> None:
    print(f"\n{title}")
    print(f"{'size':>6} | {lib + ' one-way':>16} {'GB/s':>7} | {'coursekit one-way':>17} {'GB/s':>7}"
          f" | ratio (time ours / raw)")
    for name, r in res.items():
        n = SIZES[name]
        print(f"{name:>6} | {r['raw'] * 1e6:13.1f} us {n / r['raw'] / 1e9:7.3f} | "
              f"{r['coursekit'] * 1e6:14.1f} us {n / r['coursekit'] / 1e9:7.3f} | "
              f"{r['coursekit'] / r['raw']:.2f}x")


def mpi_breakdown(parts: dict) -> None:
    """Where MpiComm's 64 MB one-way time goes (best of REPEATS, milliseconds)."""
    ms = {k: v * 1e3 for k, v in parts.items()}
    gbs = SIZES["64 MB"] / parts["memcpy"] / 1e9
    print(f"64 MB one-way, where MpiComm's time goes: raw mpi4py {ms['raw']:.2f} ms; "
          f"MpiComm {ms['coursekit']:.2f} ms = raw {ms['coursekit'] - ms['raw']:+.2f} ms "
          "(header by Issend, matched while the first piece is copied, then the payload "
          f"straight from the array); copying every payload first (MpiComm before) "
          f"{ms['copied']:.2f} ms = raw {ms['copied'] - ms['raw']:+.2f} ms, about one "
          f"memcpy: {ms['memcpy']:.2f} ms ({gbs:.1f} GB/s, the physical limit of a copy)")
    print(f"MpiComm / mpi4py at 64 MB: {parts['coursekit'] / parts['raw']:.2f}x "
          "(target <= 1.3x)")


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from coursekit.comm.procs import run_procs
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_p2p  # spawned ranks import this module by name
    shm_res = run_procs(bench_p2p.zmq_worker, 2, timeout=600)[0]
    zmq_res = run_procs(bench_p2p.zmq_worker, 2, timeout=600, shared_memory=False)[0]
    table("ZmqComm with shared-memory lanes vs raw pyzmq PUSH/PULL (2 processes)", shm_res,
          "pyzmq")
    table("ZmqComm over TCP only vs raw pyzmq PUSH/PULL (2 processes, tcp loopback)", zmq_res,
          "pyzmq")
    lat = zmq_res["8 B"]
    print(f"ZmqComm (TCP) small-message latency = {lat['coursekit'] / lat['raw']:.2f}x raw pyzmq "
          "(target <= 1.3x)")
    copy = memcpy_seconds(SIZES["64 MB"])
    print(f"physical limit: memcpy of 64 MB in {copy * 1e3:.2f} ms = "
          f"{SIZES['64 MB'] / copy / 1e9:.1f} GB/s (one thread, warm buffers)")
    print("authentication (MAC + sequence number per message), one-way time with / without: " +
          ", ".join(f"{k} {r['coursekit'] * 1e6:.1f} / {r['no auth'] * 1e6:.1f} us "
                    f"({r['coursekit'] / r['no auth']:.2f}x)" for k, r in zmq_res.items()))
    mpi_res = run_mpi()
    if mpi_res is None:
        print("\nMPI: skipped (mpi4py/mpiexec not available)")
    else:
        parts = mpi_res.pop("breakdown")
        table("MpiComm vs raw mpi4py Send/Recv (mpiexec -n 2)", mpi_res, "mpi4py")
        mpi_breakdown(parts)
        for label, res in (("lanes", shm_res), ("TCP", zmq_res)):
            ratio = {k: res[k]["coursekit"] / mpi_res[k]["raw"] for k in SIZES}
            print(f"ZmqComm ({label}) one-way time / raw MPI: " +
                  ", ".join(f"{k} {v:.1f}x" for k, v in ratio.items()))
        big = mpi_res["64 MB"]["raw"] / shm_res["64 MB"]["coursekit"]
        print(f"ZmqComm (lanes): 8 B one-way {shm_res['8 B']['coursekit'] * 1e6:.1f} us "
              f"(target <= 5 us); 64 MB at {big:.0%} of mpi4py's bandwidth (target >= 50 %)")


if __name__ == "__main__":
    if "--mpi" in sys.argv:
        mpi_main()
    else:
        main()
