"""Time collectives on any Comm and compare with the cost model (pure experiment functions).

:func:`time_collective` runs on every rank (a ThreadComm rank, an engine, an MPI rank);
:func:`measure_and_predict` drives it on the first p ranks of a runner (:mod:`coursekit.cluster.runner`:
``LocalRunner(4)`` for ThreadComm ranks, ``ClusterRunner(cluster)`` for engines), in the
shape of every chapter's experiment, a runner, then the config, then what it runs on::

    measure_and_predict(runner, TimingConfig("allreduce", "ring", sizes), link, workers=p)

where ``link`` is the fitted link the prediction uses (``measure.link(runner)``).
:func:`compare_algorithms` times several algorithms of one collective the same way, their
calls interleaved (:func:`time_algorithms`), for a comparison that load cannot tilt.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .. import checks, costmodel
from ..cluster.runner import Runner
from . import ALGORITHMS, FUNCTIONS

_ROOTED = ("bcast", "scatter", "gather", "reduce")
_SHARED = ("gather", "allgather")  # nbytes is the gathered total


def time_collective(comm, collective: str, algorithm: str, nbytes: int, repeats: int = 5,
                    seed: int = 0) -> np.ndarray:
    """Seconds per call on this rank, ``repeats`` calls of float32 data, each after a barrier.

    ``nbytes`` follows :func:`coursekit.costmodel.predict` (the whole vector). Runs with
    ``check=False`` (the model does not count the fingerprint exchange), and allreduce in
    place (``out=``: the model does not count copying the input into a new result either).
    """
    return time_algorithms(comm, collective, (algorithm,), nbytes, repeats, seed)[:, 0]


def time_algorithms(comm, collective: str, algorithms, nbytes: int, repeats: int = 5,
                    seed: int = 0) -> np.ndarray:
    """Seconds per call on this rank, shape ``(repeats, len(algorithms))``: in each round,
    one call of every algorithm in turn, each after a barrier, as :func:`time_collective`.

    Interleaving makes the comparison fair on a shared machine: a burst of other work
    (a browser redrawing, another user's job) slows every algorithm's calls of that round
    alike, instead of all the calls of whichever algorithm happened to run during it.
    """
    if collective not in FUNCTIONS:
        raise ValueError(f"unknown collective {collective!r}; allowed: {sorted(FUNCTIONS)}")
    if isinstance(algorithms, str):
        raise TypeError(f"algorithms must be a sequence of {collective} algorithm names, not "
                        f"the str {algorithms!r}; wrap one in a tuple: ({algorithms!r},)")
    for algorithm in algorithms:
        _one_of(algorithm, "algorithm", f"{collective} algorithm", list(ALGORITHMS[collective]))
    nbytes = checks.integer(nbytes, "nbytes", at_least=1)
    repeats = checks.integer(repeats, "repeats", at_least=1)
    checks.fits_in_memory(3 * nbytes, "nbytes", "a rank's input, its copy and the result")
    items = max(nbytes // 4 // (comm.size if collective in _SHARED else 1), 1)
    x = np.random.default_rng([seed, comm.rank]).standard_normal(items).astype(np.float32)
    kw = {"root": 0} if collective in _ROOTED else {}
    fn = FUNCTIONS[collective]
    times = np.empty((repeats, len(algorithms)))
    in_place = collective == "allreduce"
    for i in range(repeats):
        for j, algorithm in enumerate(algorithms):
            data = x.copy() if in_place else x
            into = {"out": data} if in_place else {}
            comm.barrier()
            t0 = time.perf_counter()
            fn(comm, data, algorithm=algorithm, check=False, **kw, **into)
            times[i, j] = time.perf_counter() - t0
    return times


def message_sizes(sizes, name: str = "sizes") -> tuple[int, ...]:
    """``sizes`` as a non-empty tuple of message sizes in bytes (integers >= 1)."""
    if isinstance(sizes, (str, bytes)) or not np.iterable(sizes):
        raise TypeError(f"{name} must be a sequence of message sizes in bytes (integers "
                        f">= 1); got {sizes!r:.60}")
    sizes = tuple(checks.integer(s, name, at_least=1, hint=" (message sizes in bytes)")
                  for s in sizes)
    if not sizes:
        raise ValueError(f"{name} is empty: give at least one message size in bytes")
    return sizes


def _one_of(value, name: str, what: str, allowed: list) -> None:
    """TypeError unless ``value`` is a str, ValueError unless it is in ``allowed``."""
    if not isinstance(value, str):
        raise TypeError(f"{name} must be a str; got {type(value).__name__} {value!r:.60}; "
                        f"allowed: {allowed}")
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; allowed: {allowed}")


@dataclass(frozen=True)
class TimingConfig:
    """What :func:`measure_and_predict` times: ``collective`` with ``algorithm`` (one of
    ``ALGORITHMS[collective]``) at each message size in ``sizes`` (bytes, as
    :func:`coursekit.costmodel.predict` counts them: the whole vector), ``repeats`` calls
    per size (the best one counts)."""

    collective: str
    algorithm: str
    sizes: tuple
    repeats: int = 5

    def __post_init__(self):
        _one_of(self.collective, "collective", "collective", list(ALGORITHMS))
        _one_of(self.algorithm, "algorithm", f"{self.collective} algorithm",
                list(ALGORITHMS[self.collective]))
        sizes = message_sizes(self.sizes)
        object.__setattr__(self, "sizes", sizes)
        checks.integer(self.repeats, "repeats", at_least=1)


@dataclass(frozen=True)
class CollectiveTiming:
    """Measured vs predicted time and busbw of one collective over message sizes.

    ``config``: what was timed; ``p``: on how many ranks; ``nbytes``: the sizes actually
    sent (rounded to whole float32 items, and for gather/allgather to p equal parts);
    ``measured``: best over repeats of the slowest rank's time, in s; ``predicted`` from
    the cost model with the link's alpha and beta; busbw in B/s (nccl-tests definition).
    """

    config: TimingConfig
    p: int
    nbytes: np.ndarray
    measured: np.ndarray
    predicted: np.ndarray
    busbw_measured: np.ndarray
    busbw_predicted: np.ndarray

    @property
    def collective(self) -> str:
        return self.config.collective

    @property
    def algorithm(self) -> str:
        return self.config.algorithm


def measure_and_predict(runner: Runner, config: TimingConfig, link, *,
                        workers: int | None = None) -> CollectiveTiming:
    """Time ``config``'s collective at each of its sizes on the first ``workers`` ranks of
    ``runner`` (default all of them): a :class:`~coursekit.cluster.runner.LocalRunner` (ThreadComm
    ranks) or a :class:`~coursekit.cluster.runner.ClusterRunner` (engines, after ``setup_comm``).

    ``link``: the fitted link the prediction uses, anything with ``.alpha`` (s) and
    ``.beta`` (s/B): :func:`coursekit.measure.link`'s result or
    :class:`coursekit.costmodel.LinkFit`. Every argument is checked before any rank starts.
    """
    checks.instance(config, "config", TimingConfig)
    return _measure(runner, config.collective, (config.algorithm,), config.sizes, link,
                    config.repeats, workers)[config.algorithm]


def compare_algorithms(runner: Runner, collective: str, algorithms, sizes, link, *,
                       repeats: int = 5, workers: int | None = None) -> dict[str, CollectiveTiming]:
    """:func:`measure_and_predict` for several ``algorithms`` of one ``collective`` at once,
    ``{algorithm: CollectiveTiming}``, their calls interleaved round by round
    (:func:`time_algorithms`), so that load which comes and goes during the run does not
    decide which one looks faster. Every argument is checked before any rank starts.
    """
    if isinstance(algorithms, str) or not np.iterable(algorithms) or not len(algorithms):
        raise TypeError(f"algorithms must be a non-empty sequence of {collective!r} algorithm "
                        f"names; got {algorithms!r:.60}")
    configs = [TimingConfig(collective, alg, sizes, repeats) for alg in algorithms]
    if len(set(algorithms)) < len(configs):
        raise ValueError(f"algorithms has repeats: {list(algorithms)}; name each one once")
    return _measure(runner, collective, tuple(algorithms), configs[0].sizes, link, repeats,
                    workers)


def _measure(runner: Runner, collective: str, algorithms: tuple, sizes: tuple, link,
             repeats: int, workers: int | None) -> dict[str, CollectiveTiming]:
    """Each algorithm's :class:`CollectiveTiming`: at every size, the best round's slowest
    rank, measured interleaved (:func:`time_algorithms`), beside the model's prediction."""
    checks.instance(runner, "runner", Runner, " (LocalRunner(n) or ClusterRunner(cluster))")
    alpha, beta = costmodel.check_link(link)
    p = runner.check_workers(workers)
    shared = p if collective in _SHARED else 1
    nbytes = np.array([4 * max(s // 4 // shared, 1) * shared for s in sizes])
    measured = np.array([  # (sizes, algorithms)
        np.max(np.stack(runner.run(time_algorithms, collective, algorithms, int(n), repeats,
                                   ranks=p)), axis=0).min(axis=0)
        for n in nbytes])
    timings = {}
    for j, algorithm in enumerate(algorithms):
        predicted = costmodel.predict(collective, algorithm, p, nbytes, alpha, beta)
        timings[algorithm] = CollectiveTiming(
            TimingConfig(collective, algorithm, sizes, repeats), p, nbytes, measured[:, j],
            predicted, costmodel.busbw(collective, p, nbytes, measured[:, j]),
            costmodel.busbw(collective, p, nbytes, np.maximum(predicted, 1e-12)))
    return timings
