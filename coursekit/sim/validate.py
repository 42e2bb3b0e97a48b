"""Check the simulator against the real thing: chapter 3's data-parallel training on the live cluster.

:func:`measure_and_simulate` measures the link between ranks 0 and 1 with
:func:`coursekit.measure.link` (``"swap"``: a ring step's two-way traffic) and the
reduction cost with :func:`coursekit.measure.gamma`, then trains the chapter-1 MLP on
synthetic data with chapter 3's :func:`~coursekit.parallel.data_parallel.train`: ring
allreduce of the whole gradient, no overlap, the same step the chapter times. Its
per-step records give (a) the compute of a step (forward + backward + update, the slowest
rank; ``DPResult.compute_per_step``) and (b) the whole step (``DPResult.time_per_step``).
A one-tensor :class:`~coursekit.sim.step.Workload` built from (a) is simulated on the
measured network and compared with (b). Within 1.5x where the modelled costs dominate (the
tests: a link with a known 20 ms latency); on the two-core local cluster it underestimates 2-3x.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coursekit import checks, measure
from coursekit.nn.layout import check_sizes, n_params
from coursekit.parallel.data_parallel import DPConfig, train
from coursekit.cluster.runner import Runner

from .network import Network
from .step import Workload, simulate_step

__all__ = ["Validation", "measure_and_simulate"]


@dataclass(frozen=True)
class Validation:
    """Measured against simulated step time (s) on p ranks; ``ratio`` = measured/simulated."""

    p: int
    alpha: float
    beta: float
    gamma: float
    grad_bytes: int
    compute_s: float
    measured_s: float
    simulated_s: float

    @property
    def ratio(self) -> float:
        return self.measured_s / self.simulated_s


def measure_and_simulate(runner, p: int, *, sizes=(64, 512, 512, 10), batch: int = 64,
                         steps: int = 20, seed: int = 0) -> Validation:
    """Measure and simulate on the first ``p`` ranks of ``runner`` (:mod:`coursekit.cluster.runner`:
    ``ClusterRunner(cluster)`` for engines, ``LocalRunner(p)`` for threads): an MLP of
    layer ``sizes``, ``batch`` examples per rank and step, ``steps`` steps (medians over
    them), synthetic data from ``seed``."""
    checks.instance(runner, "runner", Runner, " (LocalRunner(n) or ClusterRunner(cluster))")
    p = checks.integer(p, "p", at_least=2, hint=" (ranks that communicate)")
    sizes = check_sizes(sizes)
    batch = checks.integer(batch, "batch", at_least=1, hint=" (examples per rank and step)")
    steps = checks.integer(steps, "steps", at_least=1)
    runner.check_ranks(p)
    nbytes = 4 * n_params(sizes)  # float32
    checks.fits_in_memory(4 * p * nbytes, "sizes", f"{p} ranks' float32 parameters, gradients "
                          f"and buffers (4 copies each)")
    link = measure.link(runner, "swap")
    gamma = measure.gamma(runner, nbytes, repeats=steps, ranks=p)
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((batch * p, sizes[0])).astype(np.float32)
    y = rng.integers(0, sizes[-1], batch * p)
    config = DPConfig(sizes=sizes, batch_size=batch * p, epochs=steps, max_steps=steps,
                      lr=0.01, seed=seed, exchange="allreduce", algorithm="ring",
                      bucket_bytes=None, overlap=False, timeline_steps=0)
    result = train(runner, config, (X, y), workers=p)
    compute = result.compute_per_step
    work = Workload("MLP", [nbytes], [compute], 0.0, 0.0, batch)
    net = Network(p, 1, link.alpha, link.beta, link.alpha, link.beta, gamma=gamma)
    simulated = float(simulate_step(work, net, algorithm="ring", fusion_bytes=np.inf,
                                    overlap=False).step_s)
    return Validation(p, link.alpha, link.beta, gamma, nbytes, compute, result.time_per_step,
                      simulated)
