"""Time collectives on any Comm and compare with the cost model (pure experiment functions).

:func:`time_collective` runs on every rank (a ThreadComm rank, an engine, an MPI rank);
:func:`measure_and_predict` drives it on the first p ranks of a runner (:mod:`coursekit.runner`:
``LocalRunner(4)`` for ThreadComm ranks, ``ClusterRunner(cluster)`` for engines).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .. import costmodel
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
    if collective not in FUNCTIONS:
        raise ValueError(f"unknown collective {collective!r}; allowed: {sorted(FUNCTIONS)}")
    items = max(nbytes // 4 // (comm.size if collective in _SHARED else 1), 1)
    x = np.random.default_rng([seed, comm.rank]).standard_normal(items).astype(np.float32)
    kw = {"root": 0} if collective in _ROOTED else {}
    fn = FUNCTIONS[collective]
    times = np.empty(repeats)
    in_place = collective == "allreduce"
    for i in range(repeats):
        data = x.copy() if in_place else x
        into = {"out": data} if in_place else {}
        comm.barrier()
        t0 = time.perf_counter()
        fn(comm, data, algorithm=algorithm, check=False, **kw, **into)
        times[i] = time.perf_counter() - t0
    return times


@dataclass(frozen=True)
class CollectiveTiming:
    """Measured vs predicted time and busbw of one collective over message sizes.

    ``measured``: best over repeats of the slowest rank's time, in s; ``predicted`` from
    the cost model with the given alpha and beta; busbw in B/s (nccl-tests definition).
    """

    collective: str
    algorithm: str
    p: int
    nbytes: np.ndarray
    measured: np.ndarray
    predicted: np.ndarray
    busbw_measured: np.ndarray
    busbw_predicted: np.ndarray


def measure_and_predict(runner, p: int, collective: str, algorithm: str, sizes, alpha: float,
                        beta: float, repeats: int = 5) -> CollectiveTiming:
    """Time ``collective``/``algorithm`` at each size on the first ``p`` ranks of ``runner``
    (:mod:`coursekit.runner`) and predict it."""
    if algorithm not in ALGORITHMS.get(collective, ()):
        raise ValueError(f"unknown {collective} algorithm {algorithm!r}; allowed: "
                         f"{list(ALGORITHMS.get(collective, ()))}")
    sizes = np.asarray(sizes, dtype=np.int64)
    nbytes = np.array([4 * max(int(s) // 4 // (p if collective in _SHARED else 1), 1)
                       * (p if collective in _SHARED else 1) for s in sizes])
    measured = np.array([
        np.max(np.stack(runner.run(time_collective, collective, algorithm, int(n), repeats,
                                   ranks=p)), axis=0).min()
        for n in nbytes])
    predicted = costmodel.predict(collective, algorithm, p, nbytes, alpha, beta)
    return CollectiveTiming(collective, algorithm, p, nbytes, measured, predicted,
                            costmodel.busbw(collective, p, nbytes, measured),
                            costmodel.busbw(collective, p, nbytes, np.maximum(predicted, 1e-12)))
