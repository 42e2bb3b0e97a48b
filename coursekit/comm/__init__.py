"""Point-to-point messages between ranks: the Comm protocol and its backends.

>>> from coursekit.comm import run_local
>>> def ping(comm):
...     if comm.rank == 0:
...         comm.send(np.arange(3.0), dest=1)
...     else:
...         return comm.recv(source=0)
>>> run_local(ping, 2)[1]
array([0., 1., 2.])

Backends: ThreadComm (threads in one process), ZmqComm (``coursekit.comm.zmq``: processes,
e.g. ipyparallel engines; shared-memory lanes between those of one host,
``coursekit.comm.shm``, TCP between hosts), MpiComm (``coursekit.comm.mpi``: MPI ranks); ``setup_comm(cluster)``
builds the right one on every engine, ``run_procs`` (``coursekit.comm.procs``) on spawned
processes. All share the wire format in ``frames`` (never pickled).
Set ``coursekit.comm.VERBOSE = True`` (or call ``set_verbose()``) to print every send/recv.
"""

from .base import Comm
from .cluster_setup import (call_with_comm, engine_comm, engine_trace, reset_comm, setup_comm,
                            teardown_comm)
from .errors import ANY_SOURCE, ANY_TAG, MAX_TAG, CommError, CommTimeout, PeerGone
from .group import SubComm, first_ranks, subcomm
from .local import run_local
from .thread import ThreadComm
from .trace import Message

VERBOSE = False


def set_verbose(on: bool = True) -> None:
    """Print one line per send/recv on every rank of this process (``VERBOSE`` switch)."""
    global VERBOSE
    VERBOSE = bool(on)


__all__ = ["ANY_SOURCE", "ANY_TAG", "MAX_TAG", "Comm", "CommError", "CommTimeout", "Message",
           "PeerGone", "SubComm", "ThreadComm", "VERBOSE", "call_with_comm", "engine_comm", "engine_trace",
           "first_ranks", "reset_comm", "run_local", "set_verbose", "setup_comm", "subcomm",
           "teardown_comm"]
