"""The parameter server's wire protocol: who is who, which shard holds what, and the messages.

Roles (a :class:`PSTopology`): ranks ``0 .. S-1`` are server shards, ranks ``S .. S+W-1``
are workers (worker ``i`` is rank ``S + i``). Shard ``k`` holds the contiguous range
``ranges[k] = [lo, hi)`` of the flat parameter buffer (DESIGN contract 3: a shard is a
range), the first ``n % S`` shards one value longer than the rest.

Messages (NumPy arrays only, never pickles). ``Comm.recv`` does not report who sent a
message, so every request names its sender inside a small int64 header:

* worker -> shard, tag ``TAG_REQUEST``: ``[op, worker_rank, clock, read_version, n_steps]``
  - ``PUSH``: followed on ``TAG_GRAD`` by the gradient of the shard's range (the same sender
    sends both, and messages between one pair never overtake, so they stay together);
    ``clock`` is the worker's clock *after* this push (iterations completed),
    ``read_version`` the shard version the gradient was computed on, ``n_steps`` how many
    mini-batch gradients it sums (Downpour's accrued gradient; 1 otherwise);
  - ``PULL``: "send me your weights before I compute iteration ``clock``"
    (``clock = HELLO``: the first pull of a run, answered at once with the clock to start at);
  - ``DONE``: the worker finished; ``clock`` is its final clock.
* shard -> worker: ``[version, applied, clock, status]`` on ``TAG_REPLY`` then the shard's
  weights on ``TAG_WEIGHTS``. ``version`` counts the updates this shard has applied,
  ``applied`` the mini-batch gradients in them, ``clock`` the worker's clock as the shard
  knows it; ``status`` is ``OK``, ``EVICTED`` (the shard declared this worker lost) or
  ``FINISHED`` (BSP: training is over).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

from coursekit import checks
from coursekit.comm import ANY_SOURCE, CommTimeout

TAG_REQUEST, TAG_GRAD, TAG_REPLY, TAG_WEIGHTS = 40, 41, 42, 43
PUSH, PULL, DONE = 1, 2, 3
OP_NAMES = {PUSH: "push", PULL: "pull", DONE: "done"}
HELLO = -1
OK, EVICTED, FINISHED = 0, 1, 2


def shard_ranges(n_params: int, servers: int) -> list[tuple[int, int]]:
    """Contiguous ``[lo, hi)`` ranges of a buffer of ``n_params`` values, one per server shard."""
    if isinstance(servers, bool) or not isinstance(servers, (int, np.integer)) or servers < 1:
        raise ValueError(f"servers must be a positive int, got {servers!r}")
    if servers > n_params:
        raise ValueError(f"servers={servers}: {servers} server shards for {n_params} "
                         f"parameters: every shard needs at least one parameter, so use at "
                         f"most {n_params} servers")
    base, extra = divmod(n_params, servers)
    bounds = np.cumsum([0] + [base + (k < extra) for k in range(servers)])
    return [(int(lo), int(hi)) for lo, hi in zip(bounds[:-1], bounds[1:])]


_SERVERS_HINT = " (server shards, at least one)"
_WORKERS_HINT = " (a parameter server needs at least one worker)"


@dataclass(frozen=True)
class PSTopology:
    """Who is who in a run: ``servers`` shards on ranks ``0 .. S-1``, ``workers`` workers on
    ranks ``S .. S+W-1`` (the module docstring). The run's shape, kept out of
    :class:`~coursekit.parallel.param_server.config.PSConfig` as chapters 3 and 6 keep
    theirs (``train(runner, config, data, workers=...)``);
    :meth:`~coursekit.parallel.param_server.config.PSConfig.check_topology` says whether a
    run fits it."""

    servers: int
    workers: int

    def __post_init__(self):
        object.__setattr__(self, "servers", checks.integer(self.servers, "servers", at_least=1,
                                                           hint=_SERVERS_HINT))
        object.__setattr__(self, "workers", checks.integer(self.workers, "workers", at_least=1,
                                                           hint=_WORKERS_HINT))

    @classmethod
    def on(cls, size: int, servers=1, workers=None, where: str = "the comm") -> PSTopology:
        """The topology of a run on the first ranks of ``size`` (``where``, for messages):
        ``workers=None`` takes every rank that is not a server; ValueError if it needs more."""
        if workers is None:
            checks.integer(servers, "servers", at_least=1, hint=_SERVERS_HINT)
            if size - servers < 1:
                raise ValueError(f"servers={servers} leave no rank of {where} ({size} ranks) "
                                 f"for a worker{_WORKERS_HINT}: use at most {size - 1} "
                                 f"server(s) or more ranks")
            workers = size - servers
        topology = cls(servers, workers)
        if topology.n_ranks > size:
            room = size - topology.servers
            fix = (f"use at most {room} workers with {topology.servers} server(s)" if room >= 1
                   else f"use at most {size - 1} server(s)")
            raise ValueError(f"workers={topology.workers} and servers={topology.servers} need "
                             f"{topology.n_ranks} ranks but {where} has {size}: {fix}")
        return topology

    @property
    def n_ranks(self) -> int:
        return self.servers + self.workers

    @property
    def worker_ranks(self) -> range:
        return range(self.servers, self.n_ranks)

    def ranges(self, n_params: int) -> list[tuple[int, int]]:
        """Every shard's ``[lo, hi)`` in a buffer of ``n_params`` (:func:`shard_ranges`)."""
        return shard_ranges(n_params, self.servers)


class Request(NamedTuple):
    """A decoded worker request (see the module docstring)."""

    op: int
    worker_rank: int
    clock: int
    read_version: int
    n_steps: int


def send_request(comm, server: int, op: int, worker_rank: int, clock: int,
                 read_version: int = 0, n_steps: int = 0, grad: np.ndarray | None = None) -> None:
    """Send one request (and, for a PUSH, its gradient) to shard rank ``server``."""
    head = np.array([op, worker_rank, clock, read_version, n_steps], dtype=np.int64)
    comm.send(head, server, TAG_REQUEST)
    if op == PUSH:
        comm.send(grad, server, TAG_GRAD)


def recv_request(comm, wait: float) -> np.ndarray | None:
    """Wait at most ``wait`` seconds for a request from any worker; None if none came."""
    saved = comm.timeout
    comm.timeout = wait
    try:
        return comm.recv(ANY_SOURCE, TAG_REQUEST)
    except CommTimeout:
        return None
    finally:
        comm.timeout = saved


def decode_request(head: np.ndarray, worker_ranks: range) -> Request:
    """The Request in ``head``; ValueError naming the defect for a malformed one."""
    if head.dtype != np.int64 or head.shape != (5,):
        raise ValueError("a request header must be int64 of shape (5,), "
                         f"got {head.dtype}{head.shape}")
    req = Request(*(int(v) for v in head))
    if req.op not in OP_NAMES:
        raise ValueError(f"unknown request op {req.op}; known: {OP_NAMES}")
    if req.worker_rank not in worker_ranks:
        raise ValueError(f"request names rank {req.worker_rank}, which is not a worker "
                         f"(workers are ranks {worker_ranks.start}..{worker_ranks.stop - 1})")
    return req


def send_reply(comm, worker_rank: int, version: int, applied: int, clock: int, status: int,
               weights: np.ndarray) -> None:
    comm.send(np.array([version, applied, clock, status], dtype=np.int64), worker_rank, TAG_REPLY)
    comm.send(weights, worker_rank, TAG_WEIGHTS)


def recv_reply(comm, server: int, out: np.ndarray) -> tuple[int, int, int, int]:
    """Receive a shard's reply into ``out``; return ``(version, applied, clock, status)``."""
    version, applied, clock, status = (int(v) for v in comm.recv(server, TAG_REPLY))
    comm.recv(server, TAG_WEIGHTS, out=out)
    return version, applied, clock, status
