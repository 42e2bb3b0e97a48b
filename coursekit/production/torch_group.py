"""torch.distributed's default process group on the ranks of a course Comm.

    with process_group(comm) as group:          # on every rank of comm (runner.run)
        ddp = DistributedDataParallel(model)     # ranks in the comm's order

Rank i of the group is rank i of ``comm`` (the cluster's order). The rendezvous is a
``TCPStore`` that rank 0 opens on a free port of its own address (loopback when every rank
shares a host, else the address its course Comm is bound to); the course Comm carries
``host:port`` to the other ranks, so no port is fixed and nothing else is needed. Gloo's
own connections use the same address of each rank (``GLOO_SOCKET_IFNAME`` names its
interface while the group is made), never an interface the course does not use. The
backend is gloo on CPU and NCCL when every rank sees a GPU (``backend="auto"``); each
NCCL rank uses GPU ``local_rank % device_count``. Leaving the block destroys the group,
so none outlives the experiment that made it (a group an interrupted run left behind is
destroyed before a new one starts), and frees it on the thread that leaves the block
(:func:`free_on_this_thread`). Collectives that wait longer than the comm's timeout
raise (gloo's timeout is set to it).
"""

from __future__ import annotations

import contextlib
import datetime
import gc
import os
import socket
import sys
import time

import numpy as np

from coursekit import checks

from .requirement import import_torch

BACKENDS = ("auto", "gloo", "nccl")
_ADDRESS_TAG = 0x7A11  # the one message that carries host:port from rank 0


def load_torch(comm, *modules: str) -> str:
    """Import torch, torch.distributed and ``modules`` on this rank; returns torch's version.

    Run it on every rank (``runner.run(load_torch, "torch.distributed.fsdp")``) before the
    work that opens a group: four engines importing torch at once take 10-20 s on two
    cores, and a rank that finished first would wait that long in the group's rendezvous,
    past the comm's timeout."""
    import importlib
    torch = import_torch()
    for name in ("torch.distributed", *modules):
        importlib.import_module(name)
    return torch.__version__


def torch_ranks(runner, workers: int, *modules: str) -> int:
    """Check that ``runner`` runs engines with at least ``workers`` ranks and import torch
    (and ``modules``) on the first ``workers`` of them (:func:`load_torch`); returns
    ``workers``. A LocalRunner is refused: torch's default group is one per process, and
    ThreadComm ranks share one."""
    from coursekit.cluster.runner import ClusterRunner
    checks.instance(runner, "runner", ClusterRunner, " (ClusterRunner(cluster) after setup_comm: "
                    "torch.distributed needs one process per rank, ThreadComm ranks share one)")
    workers = runner.check_workers(workers)
    runner.run(load_torch, *modules, ranks=workers)
    return workers


def digits_or(data, rows: int | None = None, features: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """``data`` (an (X, y) pair with ``features`` columns), default the digits' training
    rows, as float64 X and int64 y; the first ``rows`` rows when given."""
    if data is None:
        from coursekit.data import load_digits
        digits = load_digits(dtype=np.float64)
        data = (digits.X_train, digits.y_train)
    X, y = checks.data_pair(data, "data", features=features)
    X, y = np.ascontiguousarray(X, np.float64), np.asarray(y).astype(np.int64)
    return (X, y) if rows is None else (X[:rows], y[:rows])


def group_device():
    """Where this rank's tensors must live for the open group's collectives: its GPU under
    NCCL, else the CPU (gloo)."""
    torch = import_torch()
    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _root(comm):
    while hasattr(comm, "parent"):
        comm = comm.parent
    return comm


def own_address(comm) -> str:
    """This rank's address for torch's traffic (call on every rank): loopback when all ranks
    share a host, else the address its course Comm is bound to (ZMQ), else its host name's."""
    from coursekit.collectives import allgather
    name = np.frombuffer(socket.gethostname().encode().ljust(64, b"\0")[:64], np.uint8)
    names = allgather(comm, name.copy()).reshape(comm.size, name.size)
    if (names == names[0]).all():
        return "127.0.0.1"
    root = _root(comm)
    addresses = getattr(root, "addresses", None)
    if addresses:  # ZmqComm: tcp://HOST:PORT of each parent rank
        return addresses[root.rank].removeprefix("tcp://").rpartition(":")[0]
    return socket.gethostbyname(socket.gethostname())


def interface_of(address: str) -> str:
    """The name of the network interface that holds ``address`` ("lo" for 127.0.0.1)."""
    import psutil
    for name, entries in psutil.net_if_addrs().items():
        if any(entry.family == socket.AF_INET and entry.address == address for entry in entries):
            return name
    raise ValueError(f"no network interface of this host has the address {address}")


def choose_backend(comm, backend: str = "auto") -> str:
    """"gloo", or "nccl" when ``backend="auto"`` and every rank has a GPU."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if backend != "auto":
        return backend
    from coursekit.collectives import allreduce
    torch = import_torch()
    has_gpu = np.array([1.0 if torch.cuda.is_available() else 0.0])
    return "nccl" if allreduce(comm, has_gpu, op="min")[0] == 1.0 else "gloo"


def share_address(comm, host: str, port: int) -> tuple[str, int]:
    """Rank 0's ``(host, port)`` on every rank of ``comm`` (call on every rank; the
    others' arguments are ignored): the course Comm carries it."""
    if comm.rank == 0:
        text = np.frombuffer(f"{host}:{port}".encode(), np.uint8).copy()
        for dest in range(1, comm.size):
            comm.send(text, dest, tag=_ADDRESS_TAG)
        return host, port
    text = comm.recv(0, tag=_ADDRESS_TAG).tobytes().decode()
    got_host, _, got_port = text.rpartition(":")
    return got_host, int(got_port)


#: Seconds torch's collectives may wait at least: a loaded 2-core machine can stall a rank
#: for more than a course Comm's usual 10 s (gloo would then abort the whole group).
GROUP_TIMEOUT_S = 60.0


@contextlib.contextmanager
def environment(**values: str):
    """Set these environment variables of this process while the block runs, then restore
    them (gloo and ``init_process_group``'s env:// rendezvous read them when a group is made)."""
    saved = {key: os.environ.get(key) for key in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


#: Seconds the end of a block waits for torch's threads to drop their references to the group.
GROUP_RELEASE_WAIT_S = 0.25
KEPT_GROUPS: list = []
"""Groups something else still held when their block ended: kept for the life of the
process, so that no thread but the interpreter's own at exit ever frees them."""


def free_on_this_thread(box: list, *, wait_s: float = GROUP_RELEASE_WAIT_S) -> bool:
    """Free the object in ``box`` (a one-item list holding the caller's only reference) on
    the calling thread; True when it was freed here.

    A comm hook's Python callbacks (``powerSGD_hook``'s ``Future.then``) run on gloo's
    worker threads and drop their references to the group a moment after the collective
    has returned, once they get the GIL. If theirs is the last one, the group's destructor
    runs on that worker thread and joins it: the process aborts with "Resource deadlock
    avoided". So this waits, sleeping (the GIL released), until its own reference is the
    only one; one still held elsewhere after ``wait_s`` seconds (torch's C++ side keeps
    some groups) goes to :data:`KEPT_GROUPS` instead, and False is returned."""
    obj = box.pop()
    deadline = time.monotonic() + wait_s
    while sys.getrefcount(obj) > 2:  # ``obj`` here, and getrefcount's own argument
        if time.monotonic() >= deadline:
            KEPT_GROUPS.append(obj)
            return False
        time.sleep(0.001)
    del obj  # the last reference: the destructor runs here, on the calling thread
    return True


def destroy_default_group() -> bool:
    """``torch.distributed.destroy_process_group()``, then free the group on this thread
    (:func:`free_on_this_thread`; True when it was freed here, False when kept)."""
    dist = import_torch().distributed
    box = [dist.group.WORLD]
    dist.destroy_process_group()
    return free_on_this_thread(box)


@contextlib.contextmanager
def process_group(comm, backend: str = "auto", *, timeout: float | None = None):
    """The default torch.distributed group on ``comm``'s ranks while the block runs.

    Yields the group (``torch.distributed.group.WORLD``); ``timeout`` (seconds, default the
    comm's, at least :data:`GROUP_TIMEOUT_S`) bounds the rendezvous and every collective.
    Before the group is destroyed, the garbage collector frees what the block built: a DDP
    object that outlives its group can hang rank 0 in its destructor (seen here, 1 run in 30).
    The group itself is freed on the thread that leaves the block (:func:`destroy_default_group`).
    """
    torch = import_torch()
    dist = torch.distributed
    if timeout is None:
        timeout = max(comm.timeout, GROUP_TIMEOUT_S)
    else:
        timeout = checks.real(timeout, "timeout", above=0, hint=" (seconds)")
    backend = choose_backend(comm, backend)
    if dist.is_initialized():  # left by a run that was interrupted inside its block
        destroy_default_group()
    limit = datetime.timedelta(seconds=timeout)
    own = host = own_address(comm)
    if comm.rank == 0:
        store = dist.TCPStore(host, 0, comm.size, is_master=True, timeout=limit,
                              wait_for_workers=False)
        share_address(comm, host, store.port)
    else:
        host, port = share_address(comm, host, 0)
        store = dist.TCPStore(host, port, comm.size, is_master=False, timeout=limit)
    if backend == "nccl":
        from coursekit.cluster import this_engine
        torch.cuda.set_device(this_engine().local_rank % torch.cuda.device_count())
    # gloo connects the ranks through the interface this names (read when the group is made)
    with environment(GLOO_SOCKET_IFNAME=interface_of(own)):
        dist.init_process_group(backend, store=store, rank=comm.rank, world_size=comm.size,
                                timeout=limit)
    try:
        yield dist.group.WORLD
    finally:
        gc.collect()
        destroy_default_group()
