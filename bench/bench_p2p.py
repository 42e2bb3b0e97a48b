"""Point-to-point benchmark: coursekit's Comm backends against the raw libraries, one run.

    python bench/bench_p2p.py            # ZMQ (2 spawned processes) and MPI (mpiexec -n 2)

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
    """Runs on both spawned ranks; returns {size: {"raw": s, "coursekit": s, "no auth": s}}."""
    from coursekit.comm.examples import ping_pong
    out = {}
    for name, nbytes in SIZES.items():
        iters = ITERS[name]
        _raw_zmq(comm, nbytes, 2)

        def ours():
            return ping_pong(comm, nbytes, iters, warmup=2, out=False)
        out[name] = _best({"raw": lambda: _raw_zmq(comm, nbytes, iters), "coursekit": ours,
                           "no auth": lambda: _unauthenticated(comm, ours)}, REPEATS)
    return out


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


def main() -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from coursekit.comm.procs import run_procs
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_p2p  # spawned ranks import this module by name
    zmq_res = run_procs(bench_p2p.zmq_worker, 2, timeout=600)[0]
    table("ZmqComm vs raw pyzmq PUSH/PULL (2 processes, tcp loopback)", zmq_res, "pyzmq")
    lat = zmq_res["8 B"]
    print(f"ZmqComm small-message latency = {lat['coursekit'] / lat['raw']:.2f}x raw pyzmq "
          "(target <= 1.3x)")
    print("authentication (MAC + sequence number per message), one-way time with / without: " +
          ", ".join(f"{k} {r['coursekit'] * 1e6:.1f} / {r['no auth'] * 1e6:.1f} us "
                    f"({r['coursekit'] / r['no auth']:.2f}x)" for k, r in zmq_res.items()))
    mpi_res = run_mpi()
    if mpi_res is None:
        print("\nMPI: skipped (mpi4py/mpiexec not available)")
    else:
        table("MpiComm vs raw mpi4py Send/Recv (mpiexec -n 2)", mpi_res, "mpi4py")
        ratio = {k: zmq_res[k]["coursekit"] / mpi_res[k]["raw"] for k in SIZES}
        print("ZmqComm one-way time / raw MPI: " +
              ", ".join(f"{k} {v:.1f}x" for k, v in ratio.items()))


if __name__ == "__main__":
    if "--mpi" in sys.argv:
        mpi_main()
    else:
        main()
