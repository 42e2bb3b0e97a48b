"""The input pipeline, measured: each rank's step time without and with prefetching.

The ResNet-50 case study (Jia et al. 2018) overlaps reading and preprocessing the next
batches with the current step's compute. With a read of ``r`` s per batch, ``w`` reader
threads and a compute of ``c`` s per step (:mod:`coursekit.parallel.prefetch`):

    serial      t_step = r + c
    overlapped  t_step = max(r / w, c)

:func:`measure_input_pipeline` runs both loops on every rank, over the same batches:
each rank reads its part of chapter 3's data-parallel batches (the rows
:class:`~coursekit.parallel.data_parallel.sampler.Sampler` gives it), through a
**deliberately slow reader** (``time.sleep(read_s)``, standing for a disk or network read
and decoding, then the rows copied and converted to float32) and a **compute** of real
NumPy work (a matrix product of the batch, repeated until ``compute_s`` of wall time has
passed: like a GPU step, it takes its time whatever else runs on the cores; a loaded CPU
does less work in it, not more time). The sleep releases Python's GIL, so reader threads
overlap with the compute; it needs no core, so the timing holds on a busy machine.

A step's time runs from taking its batch to the end of its compute. The first step of
the overlapped loop also waits for the queue's first batch, so the steady-state step
(:attr:`PipelineResult.serial_step`, :attr:`PipelineResult.overlapped_step`) is the median
of the steps after the first (a step the scheduler delayed on a busy machine does not
move it; with a steady queue the steps are alike, so it is also their mean). The models use the read and compute times each rank
measured (medians), not the nominal ones.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from coursekit import checks
from coursekit.cluster.runner import Runner
from coursekit.parallel.data_parallel.sampler import Sampler
from coursekit.parallel.prefetch import PrefetchLoader, check_depth

__all__ = ["PipelineConfig", "PipelineResult", "measure_input_pipeline"]


@dataclass(frozen=True)
class PipelineConfig:
    """One input-pipeline experiment: ``read_s`` seconds to read one batch, ``compute_s``
    seconds of compute per step, ``readers`` background reader threads (>= 1), ``depth``
    batches read ahead (>= readers), ``batch`` rows per rank and step, ``steps`` steps per
    loop (>= 2: the first one fills the queue), ``seed`` of the sampler's order."""

    read_s: float = 0.04
    compute_s: float = 0.03
    readers: int = 2
    depth: int = 4
    batch: int = 32
    steps: int = 12
    seed: int = 0

    def __post_init__(self):
        checks.real(self.read_s, "read_s", at_least=0, at_most=1.0,
                    hint=" (seconds to read one batch)")
        checks.real(self.compute_s, "compute_s", at_least=0, at_most=1.0,
                    hint=" (seconds of compute per step)")
        checks.integer(self.readers, "readers", at_least=1, at_most=16,
                       hint=" (background reader threads)")
        checks.integer(self.depth, "depth", at_least=1, at_most=64,
                       hint=" (batches read ahead)")
        check_depth(self.readers, self.depth)
        checks.integer(self.batch, "batch", at_least=1, hint=" (rows per rank and step)")
        checks.integer(self.steps, "steps", at_least=2, at_most=1000,
                       hint=" (the first step fills the queue)")
        checks.integer(self.seed, "seed", at_least=0)


@dataclass(frozen=True)
class PipelineResult:
    """Per rank (rows) and step (columns), in seconds: ``serial_steps`` (readers=0) and
    ``overlapped_steps`` (``config.readers`` readers); ``read_s`` and ``compute_s``: each
    rank's median measured read per batch and compute per step; ``planned``,
    ``serial_rows`` and ``overlapped_rows``: the row indices of each rank's batches (ranks,
    steps, batch) as the sampler gave them and as each loop's compute received them (one
    epoch at most, so a row appears at most once in ``planned``)."""

    config: PipelineConfig
    serial_steps: np.ndarray
    overlapped_steps: np.ndarray
    read_s: np.ndarray
    compute_s: np.ndarray
    planned: np.ndarray
    serial_rows: np.ndarray
    overlapped_rows: np.ndarray

    @property
    def ranks(self) -> int:
        return len(self.serial_steps)

    @property
    def serial_step(self) -> np.ndarray:
        """Each rank's steady-state step without prefetching (median of steps 2..n)."""
        return np.median(self.serial_steps[:, 1:], axis=1)

    @property
    def overlapped_step(self) -> np.ndarray:
        """Each rank's steady-state step with prefetching (median of steps 2..n)."""
        return np.median(self.overlapped_steps[:, 1:], axis=1)

    @property
    def serial_model(self) -> np.ndarray:
        """r + c per rank, from its measured read and compute."""
        return self.read_s + self.compute_s

    @property
    def overlapped_model(self) -> np.ndarray:
        """max(r / w, c) per rank, from its measured read and compute."""
        return np.maximum(self.read_s / self.config.readers, self.compute_s)


def _rank_loops(comm, config: PipelineConfig, X, y):
    """On one rank: the serial loop, then the prefetching loop, over the same batches."""
    import time as _time

    import numpy as _np

    sampler = Sampler(len(X), config.batch * comm.size, config.seed)
    keys = [sampler.local(step, comm.rank, comm.size)[0] for step in range(config.steps)]
    weights = _np.random.default_rng(config.seed).standard_normal((X.shape[1], 64)).astype(_np.float32)
    reads, computes = [], []

    def read(rows):  # the slow reader: a "disk" wait, then the rows preprocessed
        start = _time.perf_counter()
        _time.sleep(config.read_s)  # releases the GIL, uses no core
        batch = (_np.asarray(X[rows], _np.float32), _np.asarray(y[rows]), rows)
        reads.append(_time.perf_counter() - start)
        return batch

    def compute(xb):  # real work on the batch until compute_s of wall time has passed
        start = _time.perf_counter()
        h = xb @ weights
        while _time.perf_counter() - start < config.compute_s:
            h = _np.tanh(xb @ weights + 0.01 * h)
        computes.append(_time.perf_counter() - start)

    out = {}
    for name, readers in (("serial", 0), ("overlapped", config.readers)):
        seen, marks = [], []
        with PrefetchLoader(read, keys, readers=readers, depth=config.depth) as loader:
            marks.append(_time.perf_counter())
            for xb, _yb, rows in loader:
                compute(xb)
                marks.append(_time.perf_counter())
                seen.append(rows)
        out[name] = (_np.diff(marks), _np.array(seen))
    return (out["serial"], out["overlapped"], float(_np.median(reads)),
            float(_np.median(computes)), _np.array(keys))


def measure_input_pipeline(runner, config: PipelineConfig, data, *,
                           workers: int | None = None) -> PipelineResult:
    """Run the serial and the prefetching loop of ``config`` on ``workers`` ranks of
    ``runner`` (None: all), each rank reading its part of the batches of ``data`` = (X, y)."""
    checks.instance(runner, "runner", Runner, " (LocalRunner(n) or ClusterRunner(cluster))")
    checks.instance(config, "config", PipelineConfig, " (PipelineConfig(read_s=..., ...))")
    X, y = checks.data_pair(data)
    p = runner.check_workers(workers)
    if config.steps * config.batch * p > len(X):
        raise ValueError(f"steps={config.steps} x batch={config.batch} x {p} ranks = "
                         f"{config.steps * config.batch * p} rows > the {len(X)} rows of data: "
                         "the loops read at most one epoch (fewer steps, a smaller batch or "
                         "fewer workers)")
    per_rank = runner.run(_rank_loops, config, X, y, ranks=p)
    serial, overlapped, reads, computes, planned = zip(*per_rank)
    return PipelineResult(config, np.array([s[0] for s in serial]),
                          np.array([o[0] for o in overlapped]), np.array(reads),
                          np.array(computes), np.array(planned),
                          np.array([s[1] for s in serial]), np.array([o[1] for o in overlapped]))
