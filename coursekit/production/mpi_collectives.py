"""MPI's own collectives beside the course's, on the same MPI-launched engines.

    result = experiment(ClusterRunner(c), MpiCollectivesConfig(sizes=(1024, 1 << 20)))

``c`` is a cluster of MPI engines (``cluster.start(n, engines="mpi")``). On every rank the
library side is mpi4py's buffer calls (no pickling) on a communicator of the run's ranks
taken from ``MPI.COMM_WORLD``: ``Allreduce``, ``Bcast`` (root 0), ``Allgather`` and
``Reduce_scatter_block``. The course's side is :mod:`coursekit.collectives` with the
algorithms of :data:`COURSE_ALGORITHMS`, once over each course Comm of ``config.backends``
(``setup_comm(c, backend="mpi")``: MpiComm, ``"zmq"``: ZmqComm, the same engines). Every
call gets the same float64 inputs on both sides (rank r's from the seed ``[seed, r]``).

Sizes n are in bytes as :func:`coursekit.costmodel.predict` counts them (the whole vector:
the reduced or broadcast array, the gathered result of allgather, one rank's input of
reduce-scatter), rounded to p equal float64 blocks. A time is the median (and the best)
over ``repeats`` calls of the slowest rank's call, each call after ``MPI_Barrier`` (the
same barrier for every implementation); busbw is nccl-tests' bus bandwidth, n / t times 2(p-1)/p for
allreduce, (p-1)/p for allgather and reduce-scatter, 1 for bcast
(:func:`coursekit.costmodel.busbw`).

Equality. Bcast and allgather only move bytes: the course's result must equal MPI's
exactly. Allreduce and reduce-scatter add p float64 vectors in an order each algorithm
picks; a sum of p terms in any order is within (p-1) u sum_r |x_r| of the exact one
(u = eps/2, the unit roundoff), so two orders differ by at most

    |course - MPI| <= (p - 1) * eps * sum_r |x_r|     elementwise, eps = 2.2e-16,

which is the tolerance. ``Measurement.error`` is the largest difference in units of it
(0 for MPI itself; at most 1 means equal).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from coursekit import checks, costmodel

__all__ = ["BACKENDS", "COURSE_ALGORITHMS", "LIBRARY", "Measurement", "MpiCollectivesConfig",
           "MpiCollectivesResult", "experiment"]

LIBRARY = {"allreduce": "MPI_Allreduce", "bcast": "MPI_Bcast", "allgather": "MPI_Allgather",
           "reduce_scatter": "MPI_Reduce_scatter_block"}
"""The collectives compared -> the MPI call on the library's side."""

COURSE_ALGORITHMS = {
    "allreduce": ("ring", "recursive_doubling", "rabenseifner"),
    "bcast": ("binomial", "scatter_allgather"),
    "allgather": ("ring",),
    "reduce_scatter": ("ring",),
}
"""The course's algorithms timed by default beside each MPI call."""

BACKENDS = {"mpi": "MpiComm", "zmq": "ZmqComm"}
"""``setup_comm`` backend -> the course Comm it builds on the engines."""

MPI_SIDE = "MPI"
"""``Measurement.implementation`` and ``.transport`` of the library's own call."""

_SUMS = ("allreduce", "reduce_scatter")  # the results that add floats (a tolerance)


def _names(values, name: str, allowed, what: str) -> tuple:
    """``values`` as a tuple of distinct names from ``allowed`` (at least one)."""
    if isinstance(values, str) or not isinstance(values, (tuple, list)):
        raise TypeError(f"{name} must be a tuple of {what} (from {list(allowed)}); "
                        f"got {values!r:.60}")
    for value in values:
        if not isinstance(value, str):
            raise TypeError(f"{name} must hold {what} as str; got {value!r:.60}; "
                            f"allowed: {list(allowed)}")
        if value not in allowed:
            raise ValueError(f"{name}: unknown {what[:-1]} {value!r}; allowed: {list(allowed)}")
    if not values:
        raise ValueError(f"{name} is empty: give at least one of {list(allowed)}")
    if len(set(values)) != len(values):
        raise ValueError(f"{name}={tuple(values)!r} names one twice; give each once")
    return tuple(values)


@dataclass(frozen=True)
class MpiCollectivesConfig:
    """What :func:`experiment` compares.

    ``collectives``: names from :data:`LIBRARY`; ``sizes``: message sizes n in bytes (see
    the module docstring); ``repeats``: timed calls per implementation and size;
    ``algorithms``: collective -> the course's algorithm names to time (a collective not
    named: its :data:`COURSE_ALGORITHMS`; stored as ``((collective, (names...)), ...)``);
    ``backends``: the course Comms, ``"mpi"`` and/or ``"zmq"``; ``seed``: the inputs'.
    """

    collectives: tuple = tuple(LIBRARY)
    sizes: tuple = (1 << 10, 1 << 20, 16 << 20)
    repeats: int = 5
    algorithms: object = None
    backends: tuple = tuple(BACKENDS)
    seed: int = 0

    def __post_init__(self):
        from coursekit.collectives import ALGORITHMS
        from coursekit.collectives.timing import message_sizes

        _names(self.collectives, "collectives", LIBRARY, "collective names")
        object.__setattr__(self, "collectives", tuple(self.collectives))
        sizes = message_sizes(self.sizes)
        # a rank holds its input, the library's and each course result, and the output buffer
        checks.fits_in_memory(6 * max(sizes), "sizes", "one rank's arrays at the largest size")
        object.__setattr__(self, "sizes", sizes)
        checks.integer(self.repeats, "repeats", at_least=1, hint=" (timed calls per size)")
        _names(self.backends, "backends", BACKENDS, "course Comm backends")
        object.__setattr__(self, "backends", tuple(self.backends))
        checks.integer(self.seed, "seed", at_least=0)
        given = {} if self.algorithms is None else self.algorithms
        if isinstance(given, tuple):  # the stored form, e.g. from dataclasses.replace
            given = dict(given)
        if not isinstance(given, dict):
            raise TypeError(f"algorithms must be a dict collective -> tuple of the course's "
                            f"algorithm names, or None; got {self.algorithms!r:.60}")
        for collective in given:
            if collective not in self.collectives:
                raise ValueError(f"algorithms names {collective!r}, which is not among "
                                 f"collectives={self.collectives}")
        chosen = tuple((c, _names(given.get(c, COURSE_ALGORITHMS[c]), f"algorithms[{c!r}]",
                                  ALGORITHMS[c], "algorithm names"))
                       for c in self.collectives)
        object.__setattr__(self, "algorithms", chosen)

    def course_algorithms(self, collective: str) -> tuple:
        """The course's algorithms timed beside ``collective``'s MPI call."""
        return dict(self.algorithms)[collective]

    def items(self, p: int) -> list[int]:
        """float64 items of each size on p ranks: p equal blocks, at least one item each."""
        return [p * max(n // 8 // p, 1) for n in self.sizes]


@dataclass(frozen=True)
class Measurement:
    """One implementation of one collective at every size of the config.

    ``implementation``: ``"MPI"`` or the course's algorithm; ``transport``: ``"MPI"`` for
    the library (MPICH moves the bytes its own way) or the course Comm (``"MpiComm"``,
    ``"ZmqComm"``); ``seconds``: per size, the median over repeats of the slowest rank's
    call; ``best``: the fastest of those calls (what load from other programs slows least);
    ``busbw``: B/s, from ``seconds``; ``error``: per size, the largest |course - MPI| in
    units of the tolerance (module docstring; 0 for MPI itself, <= 1 is equal).
    """

    collective: str
    implementation: str
    transport: str
    seconds: np.ndarray
    best: np.ndarray
    busbw: np.ndarray
    error: np.ndarray

    @property
    def library(self) -> bool:
        return self.implementation == MPI_SIDE

    @property
    def label(self) -> str:
        """``MPI_Allreduce`` for the library, ``ring on MpiComm`` for the course."""
        if self.library:
            return LIBRARY[self.collective]
        return f"{self.implementation} on {self.transport}"


@dataclass(frozen=True)
class MpiCollectivesResult:
    """Every :class:`Measurement` of :func:`experiment`, in the config's order.

    ``p``: ranks; ``nbytes``: the sizes actually sent (the config's, rounded to p float64
    blocks); ``library``: the MPI library's version line.
    """

    config: MpiCollectivesConfig
    p: int
    nbytes: np.ndarray
    measurements: tuple
    library: str

    def of(self, collective: str) -> list[Measurement]:
        """The measurements of ``collective``: MPI's first, then the course's."""
        return [m for m in self.measurements if m.collective == collective]

    def get(self, collective: str, implementation: str, transport: str = MPI_SIDE) -> Measurement:
        """One measurement (``transport`` defaults to the library's)."""
        for m in self.measurements:
            if (m.collective, m.implementation, m.transport) == (collective, implementation,
                                                                  transport):
                return m
        raise KeyError(f"no measurement of {collective} {implementation} on {transport}")

    @property
    def equal(self) -> bool:
        """True when every course result equals MPI's within the tolerance."""
        return all((m.error <= 1).all() for m in self.measurements)

    def table(self) -> str:
        """busbw in GB/s, one line per measurement, one column per size."""
        from coursekit.viz import byte_label
        head = f"{'collective':<15}{'implementation':<32}" + "".join(
            f"{byte_label(n):>11}" for n in self.nbytes)
        lines = [f"busbw [GB/s] on p = {self.p} ranks", head]
        for m in self.measurements:
            lines.append(f"{m.collective:<15}{m.label:<32}"
                         + "".join(f"{b / 1e9:>11.3g}" for b in m.busbw))
        return "\n".join(lines)


# -- the ranks' side ------------------------------------------------------------------------
def library_comm(comm):
    """An mpi4py communicator of ``comm``'s ranks (ranks 0 .. p-1 of ``MPI.COMM_WORLD``;
    collective over those ranks alone). Free it when done."""
    from mpi4py import MPI

    from coursekit.comm import CommError
    world = MPI.COMM_WORLD
    if world.Get_rank() != comm.rank:
        raise CommError(f"rank {comm.rank}: the course's rank differs from the MPI rank "
                        f"{world.Get_rank()}; the engines must be MPI ranks in order")
    return world.Create_group(world.Get_group().Incl(list(range(comm.size))))


def _inputs(config, comm, collective: str, items: int) -> np.ndarray:
    """Rank r's float64 input: ``items`` values (allgather: its block of items / p)."""
    share = items // comm.size if collective == "allgather" else items
    index = list(LIBRARY).index(collective)
    return np.random.default_rng([config.seed, comm.rank, index, items]).standard_normal(share)


def _library_call(lib, collective: str, x: np.ndarray):
    """A function that runs MPI's call on ``x`` and returns its output buffer."""
    p = lib.Get_size()
    if collective == "allreduce":
        out = np.empty_like(x)
        return lambda: (lib.Allreduce(x, out), out)[1]
    if collective == "bcast":
        buf = x.copy() if lib.Get_rank() == 0 else np.zeros_like(x)
        return lambda: (lib.Bcast(buf, root=0), buf)[1]
    if collective == "allgather":
        out = np.empty(x.size * p)
        return lambda: (lib.Allgather(x, out), out)[1]
    out = np.empty(x.size // p)
    return lambda: (lib.Reduce_scatter_block(x, out), out)[1]


def _course_call(comm, collective: str, algorithm: str, x: np.ndarray):
    """A function that runs the course's collective on ``x`` and returns its result."""
    from coursekit import collectives as C
    if collective == "allreduce":
        out = np.empty_like(x)
        return lambda: C.allreduce(comm, x, algorithm=algorithm, check=False, out=out)
    if collective == "bcast":
        buf = x if comm.rank == 0 else np.zeros_like(x)
        return lambda: C.bcast(comm, buf, root=0, algorithm=algorithm, check=False)
    if collective == "allgather":
        return lambda: C.allgather(comm, x, algorithm=algorithm, check=False)
    return lambda: C.reduce_scatter(comm, x, algorithm=algorithm, check=False)


def _timed(lib, call, repeats: int):
    """(the first call's output, seconds of each of ``repeats`` calls after MPI_Barrier)."""
    output = np.array(call(), copy=True)  # also the warm-up: first touch, connections
    seconds = np.empty(repeats)
    for i in range(repeats):
        lib.Barrier()
        start = time.perf_counter()
        call()
        seconds[i] = time.perf_counter() - start
    return output, seconds


def _tolerance(lib, collective: str, x: np.ndarray) -> np.ndarray:
    """Elementwise (p-1) eps sum_r |x_r| for a sum (of this rank's output), 0 for a copy."""
    if collective not in _SUMS:
        return np.zeros(1)
    total = np.empty_like(x)
    lib.Allreduce(np.abs(x), total)
    if collective == "reduce_scatter":
        block = x.size // lib.Get_size()
        total = total[lib.Get_rank() * block:(lib.Get_rank() + 1) * block]
    return (lib.Get_size() - 1) * np.finfo(np.float64).eps * total


def _in_tolerances(difference: np.ndarray, tolerance: np.ndarray) -> float:
    """max |difference| / tolerance; a difference where the tolerance is 0 counts as inf."""
    ratio = np.divide(difference, tolerance, out=np.where(difference == 0, 0.0, np.inf),
                      where=tolerance > 0)
    return float(ratio.max()) if ratio.size else 0.0


def compare_on_rank(comm, config: MpiCollectivesConfig, time_library: bool = True) -> dict:
    """On every rank: time MPI's calls and the course's algorithms over ``comm``.

    Returns ``{(collective, implementation, size index): (seconds per repeat, error)}``;
    the library's entries (implementation ``"MPI"``) only when ``time_library``.
    """
    lib = library_comm(comm)
    found = {}
    try:
        for collective in config.collectives:
            for s, items in enumerate(config.items(comm.size)):
                x = _inputs(config, comm, collective, items)
                want, seconds = _timed(lib, _library_call(lib, collective, x),
                                       config.repeats if time_library else 0)
                if time_library:
                    found[collective, MPI_SIDE, s] = seconds, 0.0
                tolerance = _tolerance(lib, collective, x)
                for algorithm in config.course_algorithms(collective):
                    got, seconds = _timed(lib, _course_call(comm, collective, algorithm, x),
                                          config.repeats)
                    error = _in_tolerances(np.abs(got - want), tolerance)
                    found[collective, algorithm, s] = seconds, error
        return found
    finally:
        lib.Free()


def _library_version(comm) -> str:
    from mpi4py import MPI
    return MPI.Get_library_version().splitlines()[0].strip()


def _engine_settings() -> tuple:
    """Engine side: (backend, timeout, tracing) of the engine's course Comm now."""
    from coursekit.comm import engine_comm
    from coursekit.comm.mpi import MpiComm
    comm = engine_comm()
    return ("mpi" if isinstance(comm, MpiComm) else "zmq"), comm.timeout, comm.tracing


# -- the notebook's side --------------------------------------------------------------------
def experiment(runner, config: MpiCollectivesConfig, *, workers: int | None = None
               ) -> MpiCollectivesResult:
    """Time MPI's collectives and the course's over each of ``config.backends`` on the first
    ``workers`` engines of ``runner`` (a ClusterRunner of MPI engines; default all of them),
    checking every course result against MPI's. The engines' course Comm is switched with
    ``setup_comm`` for each backend and set back to the one they had when it ends."""
    from coursekit.cluster.runner import ClusterRunner
    from coursekit.comm import setup_comm

    checks.instance(runner, "runner", ClusterRunner,
                    " (ClusterRunner(c) of MPI engines: cluster.start(n, engines='mpi'))")
    checks.instance(config, "config", MpiCollectivesConfig)
    p = runner.check_workers(workers)
    cluster = runner.cluster
    if not cluster.mpi:
        raise ValueError("runner: MPI's collectives need engines launched with MPI "
                         "(cluster.start(n, engines='mpi')); this cluster's engines are not")
    backend, timeout, trace = cluster.run(_engine_settings)[0]
    runs = {}
    try:
        for i, name in enumerate(config.backends):
            setup_comm(cluster, backend=name, timeout=timeout)
            runs[name] = runner.run(compare_on_rank, config, i == 0, ranks=p)
    finally:
        setup_comm(cluster, backend=backend, timeout=timeout, trace=trace)
    library = runner.run(_library_version, ranks=1)[0]
    nbytes = np.array([8 * n for n in config.items(p)])
    measurements = []
    for collective in config.collectives:
        sides = [(MPI_SIDE, MPI_SIDE, config.backends[0])] + [
            (algorithm, BACKENDS[name], name) for name in config.backends
            for algorithm in config.course_algorithms(collective)]
        for implementation, transport, name in sides:
            slowest = [np.max([r[collective, implementation, s][0] for r in runs[name]],
                              axis=0) for s in range(len(nbytes))]  # per call: slowest rank
            seconds = np.array([np.median(calls) for calls in slowest])
            error = np.array([max(r[collective, implementation, s][1] for r in runs[name])
                              for s in range(len(nbytes))])
            measurements.append(Measurement(
                collective, implementation, transport, seconds,
                np.array([calls.min() for calls in slowest]),
                costmodel.busbw(collective, p, nbytes, seconds), error))
    return MpiCollectivesResult(config, p, nbytes, tuple(measurements), library)
