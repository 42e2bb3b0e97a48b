"""Synchronous data-parallel SGD: every worker holds the whole model and a slice of each batch.

>>> from coursekit.cluster.runner import LocalRunner
>>> from coursekit.data import load_digits
>>> d = load_digits()
>>> r = train(LocalRunner(2), DPConfig(sizes=(64, 16, 10), epochs=1), (d.X_train, d.y_train))
>>> r.n_workers
2

* :mod:`.sync_sgd` - the worker's step (:func:`train_worker`) and :func:`train` on a runner;
* :mod:`.config` / :mod:`.results` - :class:`DPConfig` in, :class:`DPResult` out;
  ``DPConfig(device="cuda")`` computes every worker's gradient on its GPU: a step is then
  t_compute + t_stage + t_comm ("stage" spans: host <-> device copies; ``DPResult.devices``);
* :mod:`.strategies` - the exchange strategies: allreduce, parameter server or averaging, and their cost formulas;
  :mod:`.buckets` - gradient buckets overlapped with the backward pass;
* :mod:`.sampler` - each worker's rows of the global batch; :mod:`.lr_rules` - the
  learning-rate rules for a batch that grows with the workers;
* checkpoints every k steps, resumed bit for bit:
  :class:`coursekit.parallel.checkpoint.RankState`;
* :mod:`.experiments` - chapter 3's sweeps (exchange, LR rules, stragglers, scaling).
"""

from .config import DPConfig
from .results import DPResult, RankResult
from .sync_sgd import WorkerCrashed, train, train_worker

__all__ = ["DPConfig", "DPResult", "RankResult", "WorkerCrashed", "train", "train_worker"]
