"""Check the simulator against the real thing: a data-parallel step on the live cluster.

:func:`dp_step` runs on every rank (engine, MPI rank or ThreadComm rank): it trains the
chapter-1 MLP on its shard of synthetic data, timing (a) compute alone: gradient + update,
and (b) a synchronous data-parallel step: gradient, ring allreduce of the flat gradient,
update. :func:`measure_and_simulate` measures the link with :func:`~coursekit.sim.calibrate.swap_times`
(a ring step's two-way traffic),
builds a one-tensor :class:`~coursekit.sim.step.Workload` from (a) and compares the
simulated step with (b). The course's promise: within 1.5x on the local cluster.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from .calibrate import SIZES, link_fit, swap_times
from .network import Network
from .step import Workload, simulate_step

__all__ = ["Validation", "dp_step", "measure_and_simulate"]


def dp_step(comm, sizes=(64, 512, 512, 10), batch: int = 64, steps: int = 20,
            seed: int = 0) -> tuple[float, float, int]:
    """Medians on this rank: (compute-only step s, data-parallel step s, reduction s/B),
    and the gradient's bytes. The reduction cost gamma is timed as ``a += b`` on the
    gradient (what every allreduce step does to the chunk it receives)."""
    from coursekit.collectives import allreduce
    from coursekit.nn import MLP, SGD

    rng = np.random.default_rng([seed, comm.rank])
    X = rng.standard_normal((batch, sizes[0])).astype(np.float32)
    y = rng.integers(0, sizes[-1], batch)
    model = MLP(list(sizes), seed=seed)
    opt = SGD(model.params, lr=0.01)
    grad = np.empty_like(model.params)

    def compute():
        model.loss_and_grad(X, y, out=grad, validate=False)
        opt.step(grad)

    def step():
        model.loss_and_grad(X, y, out=grad, validate=False)
        allreduce(comm, grad, algorithm="ring", check=False, out=grad)
        np.divide(grad, comm.size, out=grad)
        opt.step(grad)

    other = np.zeros_like(grad)

    def reduce():
        grad.__iadd__(other)

    times = {}
    for name, fn in (("compute", compute), ("step", step), ("reduce", reduce)):
        t = []
        for _ in range(steps):
            comm.barrier()
            t0 = time.perf_counter()
            fn()
            t.append(time.perf_counter() - t0)
        times[name] = float(np.median(t[2:]))  # the first steps warm caches and sockets
    return times["compute"], times["step"], times["reduce"] / grad.nbytes, grad.nbytes


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
             steps: int = 20) -> Validation:
    """Measure and simulate on the first ``p`` ranks of ``runner`` (:mod:`coursekit.runner`:
    ``ClusterRunner(cluster)`` for engines, ``LocalRunner(p)`` for threads)."""
    if p < 2:
        raise ValueError(f"measure_and_simulate needs at least 2 ranks to communicate, got p={p}")
    link = link_fit(SIZES, runner.run(swap_times, SIZES, 5, 0, 1, ranks=p)[0])
    results = runner.run(dp_step, tuple(sizes), batch, steps, ranks=p)
    compute = max(r[0] for r in results)
    measured = max(r[1] for r in results)
    gamma = float(np.median([r[2] for r in results]))
    nbytes = results[0][3]
    work = Workload("MLP", [nbytes], [compute], 0.0, 0.0, batch)
    net = Network(p, 1, link.alpha, link.beta, link.alpha, link.beta, gamma=gamma)
    simulated = simulate_step(work, net, algorithm="ring", fusion_bytes=np.inf,
                              overlap=False).step_s
    return Validation(p, link.alpha, link.beta, gamma, nbytes, compute, measured, simulated)
