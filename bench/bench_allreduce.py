"""Bus bandwidth of coursekit's ring allreduce against MPI's own, in one run.

    .venv/bin/python bench/bench_allreduce.py [--sizes 1024 1048576 67108864] [--ranks 2 4]

Launches ``mpiexec -n P`` of this file for each P; every rank builds an MpiComm and a
ZmqComm (loopback; addresses exchanged with mpi4py) and times, per float32 message size:
mpi4py's native ``Allreduce``, ``coursekit.collectives.allreduce(..., algorithm="ring",
check=False)`` on MpiComm, on ZmqComm (shared-memory lanes between the ranks, its default on
one host) and on ZmqComm over TCP only (``shared_memory=False``). A sample is the slowest rank's time of one call
after a barrier; the table shows the median sample as nccl-tests' busbw
(algbw * 2(p-1)/p, :func:`coursekit.costmodel.busbw`) and the ratio to native MPI.
Targets (issue 4): MpiComm ring >= 0.8x and ZmqComm ring >= 0.6x native at 64 MB; (issue 30)
ZmqComm (lanes) >= 0.5x native at 1 MiB and >= 1x at 64 MiB, for p = 2 and 4.
"""

from __future__ import annotations

import argparse
import json
import secrets
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

SIZES = (1 << 10, 1 << 20, 64 << 20)


def _iters(nbytes):
    """Samples per size: 64 at 1 MiB, at most 200, at least 9 (a median of 3 moved by a
    third when one of four ranks on two cores was descheduled in one sample)."""
    return max(9, min(200, (1 << 30) // (nbytes * 16)))


def _time(mpi, fn, iters):
    """Median over iters of the slowest rank's time of one call (after a barrier)."""
    from mpi4py import MPI
    fn()  # warm-up: first-touch of buffers, connections
    samples = []
    for _ in range(iters):
        mpi.Barrier()
        t0 = time.perf_counter()
        fn()
        samples.append(mpi.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    return float(np.median(samples))


def worker(sizes):
    from mpi4py import MPI

    from coursekit.collectives import allreduce
    from coursekit.comm.mpi import MpiComm
    from coursekit.comm.zmq import bind

    mpi = MPI.COMM_WORLD
    mcomm = MpiComm(timeout=120)
    endpoint = bind("127.0.0.1")
    key = mpi.bcast(secrets.token_bytes(32) if mpi.rank == 0 else None)
    zcomm = endpoint.connect(mpi.rank, mpi.allgather(endpoint.address), key=key, timeout=120)
    endpoint = bind("127.0.0.1")
    tcomm = endpoint.connect(mpi.rank, mpi.allgather(endpoint.address), key=key, timeout=120,
                             shared_memory=False)
    assert len(zcomm.shared_memory_peers) == mpi.size and not tcomm.shared_memory_peers
    rows = []
    for nbytes in sizes:
        x = np.random.default_rng(mpi.rank).standard_normal(nbytes // 4).astype(np.float32)
        out = np.empty_like(x)
        iters = _iters(nbytes)
        want = np.empty_like(x)
        mpi.Allreduce(x, want)
        for comm in (mcomm, zcomm, tcomm):  # same answer as MPI before timing anything
            np.testing.assert_allclose(allreduce(comm, x, check=False), want, rtol=1e-4, atol=1e-4)
        rows.append({
            "p": mpi.size, "nbytes": nbytes,
            "native": _time(mpi, lambda: mpi.Allreduce(x, out), iters),
            "mpi_ring": _time(mpi, lambda: allreduce(mcomm, x, check=False), iters),
            "zmq_ring": _time(mpi, lambda: allreduce(zcomm, x, check=False), iters),
            "tcp_ring": _time(mpi, lambda: allreduce(tcomm, x, check=False), iters),
        })
    tcomm.close()
    zcomm.close()
    mcomm.close()
    if mpi.rank == 0:
        print(json.dumps(rows), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--ranks", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        return worker(args.sizes)
    from coursekit.costmodel import busbw
    from coursekit.viz import byte_label

    mpiexec = Path(sys.executable).parent / "mpiexec"
    print(f"{'p':>2} {'size':>8} | {'native MPI':>11} | {'MpiComm ring':>12} {'ratio':>6} | "
          f"{'ZmqComm ring':>12} {'ratio':>6} | {'ZmqComm TCP':>11} {'ratio':>6}"
          "   (busbw GB/s, median of slowest rank)")
    for p in args.ranks:
        cmd = [str(mpiexec), "-n", str(p), sys.executable, __file__, "--worker",
               "--sizes", *map(str, args.sizes)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
        if done.returncode:
            sys.exit(f"{' '.join(cmd)} failed:\n{done.stderr[-3000:]}")
        for row in json.loads(done.stdout.strip().splitlines()[-1]):
            bw = {k: busbw("allreduce", p, row["nbytes"], row[k]) / 1e9
                  for k in ("native", "mpi_ring", "zmq_ring", "tcp_ring")}
            print(f"{p:>2} {byte_label(row['nbytes']):>8} | {bw['native']:>11.3g} | "
                  f"{bw['mpi_ring']:>12.3g} {bw['mpi_ring'] / bw['native']:>5.2f}x | "
                  f"{bw['zmq_ring']:>12.3g} {bw['zmq_ring'] / bw['native']:>5.2f}x | "
                  f"{bw['tcp_ring']:>11.3g} {bw['tcp_ring'] / bw['native']:>5.2f}x")


if __name__ == "__main__":
    main()
