"""Build a Comm on every engine of a coursekit cluster, engine-to-engine (never via the client).

    from coursekit import cluster
    from coursekit.comm import setup_comm
    from coursekit.comm.examples import ring_exchange
    from coursekit.cluster.runner import ClusterRunner
    with cluster.start(n=4) as c:
        setup_comm(c)                                   # ZmqComm on loopback (or MpiComm)
        ClusterRunner(c).run(ring_exchange, 8)          # runs ring_exchange(comm, 8) everywhere

Experiments and notebooks start work on ranks with a runner (:mod:`coursekit.cluster.runner`), which
gives ``fn`` a Comm of the ranks it asked for. :func:`call_with_comm` hands ``fn`` the
engine's own comm through ``cluster.run``: for the tests of the transport itself (its
addresses, its trace, what a reset drops, how an engine's death is reported).

ZMQ setup is the two-phase protocol of ``coursekit.comm.zmq``: one ``c.run`` binds on
every engine and returns the addresses in rank order, a second one connects every engine
to all of them and checks the wiring with a barrier. The comm's frames are authenticated
with a key each engine derives from the cluster's ipyparallel session key and a fresh
nonce (``auth.derive_key``): no secret crosses the wire, and each setup has its own key. On MPI engines one ``c.run``
constructs an MpiComm on all ranks at once (a collective call). The comm lives on the
engine; code running there gets it with :func:`engine_comm`.
"""

from __future__ import annotations

import secrets

from coursekit import checks

from .auth import derive_key
from .errors import CommError

BACKENDS = ("auto", "zmq", "mpi")

_endpoint = None  # engine side, between the two ZMQ phases
_comm = None      # engine side: the Comm of this engine


def setup_comm(cluster_handle, backend: str = "auto", interface: str | None = None,
               timeout: float = 30.0, trace: bool = False, shared_memory: bool = True) -> str:
    """Create a Comm on every engine of ``cluster_handle``; return the backend used.

    ``backend="auto"`` picks MPI when the engines are MPI ranks, else ZMQ. ``interface``
    is where ZMQ engines bind (an IP address or interface name, e.g. "eth0" on a real
    cluster); by default loopback when every engine runs on one host, else each engine
    binds the address it reaches the controller from (never every interface), so the same
    notebook runs on a laptop and across hosts. ``timeout`` becomes each comm's timeout;
    ``trace`` turns tracing on. ``shared_memory`` (ZMQ only): engines on one host exchange
    messages through shared-memory lanes (:mod:`coursekit.comm.shm`) instead of TCP
    loopback; ``False`` keeps every message on TCP (to measure what the socket costs).
    A previous comm on the engines is closed first.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if interface is not None and not isinstance(interface, str):
        raise TypeError(f"interface must be an IP address or an interface name (a str such as "
                        f"'eth0') or None; got {interface!r:.60}")
    checks.real(timeout, "timeout", above=0, hint=" (seconds)")
    checks.boolean(trace, "trace")
    checks.boolean(shared_memory, "shared_memory")
    checks.cluster(cluster_handle, "cluster_handle")
    is_mpi = bool(getattr(cluster_handle, "mpi", False))
    if backend == "auto":
        backend = "mpi" if is_mpi else "zmq"
    if backend == "mpi" and not is_mpi:
        raise ValueError("backend='mpi' needs engines launched with MPI "
                         "(cluster.start(engines='mpi')); use backend='zmq'")
    limit = timeout + 30.0
    if backend == "mpi":
        cluster_handle.run(_make_mpi_comm, timeout, trace, timeout=limit)
        return backend
    if interface is None:
        interface = _default_interface(cluster_handle)
    addresses = cluster_handle.run(_bind, interface, timeout=limit)
    nonce = secrets.token_bytes(16)
    cluster_handle.run(_connect, addresses, nonce, timeout, trace, shared_memory, timeout=limit)
    return backend


def reset_comm(cluster_handle) -> str:
    """Rebuild the engines' comms with the settings they have (backend, interface, timeout,
    tracing): the cheap way to drop every message still in flight after a run that broke
    off (a crashed worker, an interrupted collective). Returns the backend."""
    checks.cluster(cluster_handle, "cluster_handle")
    backend, interface, timeout, trace, shared = cluster_handle.run(_settings)[0]
    return setup_comm(cluster_handle, backend, interface, timeout, trace, shared)


def _settings() -> tuple:
    comm = engine_comm()
    backend = "mpi" if type(comm).__name__ == "MpiComm" else "zmq"
    shared = backend == "mpi" or comm.shared_memory_requested
    return backend, SAME_ADDRESS, comm.timeout, comm.tracing, shared


def teardown_comm(cluster_handle) -> None:
    """Close the comm on every engine (its sockets or MPI communicators)."""
    checks.cluster(cluster_handle, "cluster_handle")
    cluster_handle.run(_close)


def engine_comm():
    """The Comm that :func:`setup_comm` built on this engine."""
    if _comm is None or _comm.closed:
        raise CommError("no Comm on this engine: call coursekit.comm.setup_comm(cluster) "
                        "from the notebook first")
    return _comm


def engine_trace(clear: bool = False) -> list:
    """Engine side: this engine's trace (``clear=True`` empties it after reading).

    ``cluster.run(engine_trace)`` collects every rank's messages for a timeline.
    """
    checks.boolean(clear, "clear")
    trace = list(engine_comm().trace)
    if clear:
        engine_comm().trace.clear()
    return trace


def call_with_comm(fn, *args, **kwargs):
    """Engine side: ``fn(engine_comm(), *args, **kwargs)``; pass it to ``cluster.run``."""
    return fn(engine_comm(), *args, **kwargs)


def _rank() -> int:
    from coursekit.cluster import this_engine
    return this_engine().rank


def _close() -> None:
    global _comm, _endpoint
    if _comm is not None:
        _comm.close()
    if _endpoint is not None:
        _endpoint.close()
    _comm = _endpoint = None


#: ``_bind``'s interfaces for "the address this engine reaches the controller from" and
#: "the address this engine's comm is bound to now" (each engine has its own).
TOWARDS_CONTROLLER, SAME_ADDRESS = "towards:", "same:"


def _default_interface(cluster_handle) -> str:
    """Loopback when all engines share a host; else ``towards:<controller address>``.

    A controller listening on every interface (``*``) is reached at the ``location`` its
    connection file names (its host's address or name, resolved on each engine)."""
    hosts = set(cluster_handle.run(_host))
    if len(hosts) == 1:
        return "127.0.0.1"
    config = cluster_handle.client._config
    address = config["interface"].split("://")[-1]  # tcp://ADDRESS of the controller
    if address in ("*", "0.0.0.0"):
        address = config.get("location") or ""
    if not address:
        raise CommError("the controller listens on every interface and its connection file "
                        "names no location: pass setup_comm(cluster, interface=...) with the "
                        "network every host shares (an address or a name such as 'eth0')")
    return TOWARDS_CONTROLLER + address


def _host() -> str:
    from coursekit.cluster import this_engine
    return this_engine().host


def _source_address(destination: str) -> str:
    """The local address the kernel routes ``destination`` from (a UDP connect sends
    nothing; it only picks the route)."""
    import socket
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((destination, 9))
        return probe.getsockname()[0]


def _bind(interface: str) -> str:
    global _endpoint
    from .zmq import bind
    if interface == SAME_ADDRESS:
        comm = engine_comm()
        interface = comm.addresses[comm.rank].removeprefix("tcp://").rpartition(":")[0]
    elif interface.startswith(TOWARDS_CONTROLLER):
        interface = _source_address(interface[len(TOWARDS_CONTROLLER):])
    _close()
    _endpoint = bind(interface)
    return _endpoint.address


def _session_key() -> bytes:
    """This engine's ipyparallel session key (the one that signs its messages)."""
    from IPython import get_ipython
    shell = get_ipython()
    kernel = getattr(shell, "kernel", None)
    if kernel is None:
        raise CommError("setup_comm must run on ipyparallel engines (no engine kernel here)")
    return kernel.session.key


def _connect(addresses: list, nonce: bytes, timeout: float, trace: bool,
             shared_memory: bool) -> None:
    global _comm, _endpoint
    if _endpoint is None:
        raise CommError("setup_comm's bind phase did not run on this engine")
    key = derive_key(_session_key(), nonce)
    _comm, _endpoint = _endpoint.connect(_rank(), addresses, key=key, timeout=timeout,
                                         trace=trace, shared_memory=shared_memory), None
    _comm.barrier()  # every engine reached every other one: the wiring is right


def _make_mpi_comm(timeout: float, trace: bool) -> None:
    """A notebook that uses only ranks 0 .. size-1 of a bigger MPI job (an instructor's
    cluster) gets a communicator of those ranks: ``MPI_Comm_create_group`` is collective
    over the group alone, so the job's other engines are not involved."""
    global _comm
    from mpi4py import MPI

    from coursekit.cluster import this_engine

    from .mpi import MpiComm
    _close()
    world, size = MPI.COMM_WORLD, this_engine().size
    base = world if size == world.Get_size() else \
        world.Create_group(world.Get_group().Incl(list(range(size))))
    _comm = MpiComm(base, timeout=timeout, trace=trace)
    if base is not world:
        base.Free()  # MpiComm works on its own duplicates
    if _comm.rank != _rank():
        raise CommError(f"MPI rank {_comm.rank} differs from the cluster's rank {_rank()}")
