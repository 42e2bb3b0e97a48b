"""The transports engines can talk over, and what each charges per message.

One Comm API, three ways to move the bytes between engines:

* ``"shared memory"``: ZmqComm's lanes between engines on one host
  (:mod:`coursekit.comm.shm`; its default): a record written into a ring the receiver
  maps, large arrays read straight out of the sender's memory;
* ``"tcp"``: ZmqComm with every message on a TCP socket (``shared_memory=False``): the
  only way between hosts, and what a local cluster used before lanes;
* ``"mpi"``: MpiComm, on engines launched by ``mpiexec`` (``cluster.start(engines="mpi")``):
  MPICH moves the bytes through its own shared memory.

Each is fitted to the lecture's t = alpha + n beta by a ping-pong (:func:`coursekit.measure.link`).
Where alpha goes: :func:`software_path` times one rank sending a small message to itself and
receiving it (the Comm's Python, checks, framing and the transport's own calls, no second
process); the rest of a one-way alpha is handing the message to another process and that
process noticing it (a system call and a wake-up on TCP, a cache line on shared memory).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from coursekit import checks, measure
from coursekit.comm.cluster_setup import setup_comm

TRANSPORTS = ("shared memory", "tcp", "mpi")


def reachable(cluster) -> tuple:
    """The transports ``cluster``'s engines can use: MPI engines all three, others the two
    ZmqComm ones."""
    checks.cluster(cluster, "cluster")
    return TRANSPORTS if getattr(cluster, "mpi", False) else TRANSPORTS[:2]


def use(cluster, transport: str, *, timeout: float = 30.0) -> str:
    """Rebuild the engines' comms on ``transport`` (one of :data:`TRANSPORTS`); returns the
    backend (``"zmq"`` or ``"mpi"``)."""
    allowed = reachable(cluster)
    if transport not in allowed:
        raise ValueError(f"transport must be one of {allowed} on this cluster, got {transport!r}"
                         + ("" if transport != "mpi" else
                            " (MPI needs engines started with cluster.start(engines='mpi'))"))
    if transport == "mpi":
        return setup_comm(cluster, backend="mpi", timeout=timeout)
    return setup_comm(cluster, backend="zmq", timeout=timeout,
                      shared_memory=transport == "shared memory")


def in_use(comm) -> str:
    """Engine side: the transport ``comm`` uses to its neighbour rank (1 for rank 0)."""
    if type(comm).__name__ == "MpiComm":
        return "mpi"
    peer = (comm.rank + 1) % comm.size
    return "shared memory" if peer in comm.shared_memory_peers else "tcp"


def software_path(comm, nbytes: int = 8, iters: int = 2000) -> float:
    """Engine side: seconds rank 0 takes to send itself ``nbytes`` and receive them (other
    ranks return 0.0): the per-message cost of the Comm and the transport's calls, with no
    second process to wake."""
    import numpy as np
    if comm.rank:
        return 0.0
    x, out = np.zeros(nbytes, np.uint8), np.empty(nbytes, np.uint8)
    for _ in range(20):
        comm.send(x, 0)
        comm.recv(0, out=out)
    t0 = time.perf_counter()
    for _ in range(iters):
        comm.send(x, 0)
        comm.recv(0, out=out)
    return (time.perf_counter() - t0) / iters


@dataclass
class TransportFit:
    """``link``: the ping-pong fit of ``transport``; ``software``: :func:`software_path`'s
    seconds for 8 B (a send and a receive by one rank)."""

    transport: str
    link: measure.MeasuredLink
    software: float


def fit(cluster, transport: str, sizes=measure.SIZES, repeats: int = 10, *,
        timeout: float = 30.0) -> TransportFit:
    """Switch ``cluster``'s engines to ``transport``, fit its link between engines 0 and 1
    and time its software path; the engines keep that transport afterwards."""
    from coursekit.cluster.runner import ClusterRunner
    use(cluster, transport, timeout=timeout)
    runner = ClusterRunner(cluster)
    got = runner.run(in_use, ranks=2)[0]
    if got != transport:
        raise RuntimeError(f"engines 0 and 1 talk over {got}, not {transport}: they do not "
                           "share a host, or this host cannot map shared memory between them")
    link = measure.link(runner, "pingpong", sizes, repeats)
    return TransportFit(transport, link, runner.run(software_path, ranks=1)[0])
