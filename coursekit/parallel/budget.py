"""When model parallelism is worth it: a model that does not fit one engine's memory budget.

An engine (a GPU, or here a cluster engine) has a memory budget. With an MLP of widths
``sizes = [n_0, ..., n_L]`` (layer l holds ``W_l`` of ``n_l x n_{l+1}`` and ``b_l`` of
``n_{l+1}``), ``itemsize`` bytes per number and p ranks, rank r holds in parameters:

* **data parallel**: the whole model on every rank, ``sum_l (n_l + 1) n_{l+1}`` numbers;
* **layer split** (a pipeline's stages, :func:`~coursekit.parallel.pipeline.execute.stage_layers`):
  rank r holds its block of layers, ``sum_{l in stage r} (n_l + 1) n_{l+1}``;
* **tensor parallel** (:class:`~coursekit.parallel.tensor_parallel.TensorParallelMLP`):
  a column-parallel layer (even l) ``n_l n_{l+1} / p + n_{l+1} / p``, a row-parallel layer
  (odd l) ``n_l n_{l+1} / p + n_{l+1}`` (its bias is replicated);

times ``itemsize`` (:func:`param_bytes`). :func:`step_within_budget` refuses a strategy whose
largest rank exceeds the budget (:class:`MemoryBudgetError`, naming bytes needed and the
budget) before any rank starts, and otherwise runs one training step on the runner and
reports the bytes each rank's part really holds. Parameters only: gradients and optimizer
state scale the same way, activations are chapter 8's subject.

Each rank builds the whole MLP (same seed: the same weights everywhere) and computes with
views of its part; ``held_bytes`` counts the arrays of that part, which is what a rank
that allocated only its part would hold.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from coursekit import checks
from coursekit.nn import layout

__all__ = ["STRATEGIES", "BudgetConfig", "BudgetResult", "MemoryBudgetError", "param_bytes",
           "step_within_budget"]

STRATEGIES = ("data parallel", "layer split", "tensor parallel")


class MemoryBudgetError(ValueError):
    """A strategy needs more bytes per rank than the budget (``needed``, ``budget``)."""

    def __init__(self, message: str, needed: int, budget: int):
        super().__init__(message)
        self.needed, self.budget = needed, budget


def _check_strategy(strategy: str) -> str:
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r}: allowed {STRATEGIES}")
    return strategy


def param_bytes(sizes, strategy: str, p: int, *, itemsize: int = 8) -> np.ndarray:
    """Parameter bytes every rank holds under ``strategy`` (the module docstring's formulas)."""
    from coursekit.parallel.pipeline.execute import stage_layers
    from coursekit.parallel.tensor_parallel import _split

    sizes = layout.check_sizes(sizes)
    _check_strategy(strategy)
    p = checks.integer(p, "p", at_least=1, hint=" (ranks)")
    itemsize = checks.integer(itemsize, "itemsize", at_least=1, hint=" (bytes per number)")
    per_layer = [(a + 1) * b for a, b in zip(sizes[:-1], sizes[1:])]
    if strategy == "data parallel":
        numbers = [sum(per_layer)] * p
    elif strategy == "layer split":
        numbers = [sum(per_layer[l] for l in block) for block in stage_layers(len(per_layer), p)]
    else:
        numbers = [0] * p
        for l, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            if l % 2 == 0:
                k = _split(b, p, f"layer {l} is column-parallel: its n_out")
                share = a * k + k
            else:
                share = _split(a, p, f"layer {l} is row-parallel: its n_in") * b + b
            numbers = [n + share for n in numbers]
    return np.array(numbers, np.int64) * itemsize


def _mb(nbytes) -> str:
    return f"{nbytes / 1e6:.2f} MB"


@dataclass(frozen=True)
class BudgetConfig:
    """One step of the MLP ``sizes`` (``dtype``, seed ``seed``) under ``strategy`` on ranks
    whose parameters may take at most ``budget_bytes`` each."""

    sizes: tuple
    strategy: str
    budget_bytes: int
    dtype: str = "float64"
    seed: int = 0

    def __post_init__(self):
        object.__setattr__(self, "sizes", layout.check_sizes(self.sizes))
        _check_strategy(self.strategy)
        checks.integer(self.budget_bytes, "budget_bytes", at_least=1,
                       hint=" (parameter bytes one rank may hold)")
        checks.float_dtype(self.dtype)
        checks.integer(self.seed, "seed", at_least=0)

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    def needed(self, p: int) -> np.ndarray:
        """:func:`param_bytes` of this config on ``p`` ranks."""
        return param_bytes(self.sizes, self.strategy, p, itemsize=self.itemsize)

    def check_fits(self, p: int) -> np.ndarray:
        """The bytes per rank; :class:`MemoryBudgetError` if the largest exceeds the budget,
        naming what every strategy would need."""
        needed = self.needed(p)
        if needed.max() > self.budget_bytes:
            others = ", ".join(
                f"{s}: {_mb(param_bytes(self.sizes, s, p, itemsize=self.itemsize).max())}"
                for s in STRATEGIES if s != self.strategy)
            raise MemoryBudgetError(
                f"{self.strategy} needs {_mb(needed.max())} ({int(needed.max()):,} bytes) of "
                f"parameters on a rank, but the budget is {_mb(self.budget_bytes)} "
                f"({self.budget_bytes:,} bytes) per rank. Split the model: on {p} ranks "
                f"the largest rank needs {others}", int(needed.max()), self.budget_bytes)
        return needed


@dataclass
class BudgetResult:
    """One step under ``config`` on ``p`` ranks: the loss, the whole gradient (the ranks'
    parts assembled), the parameter bytes each rank's part holds (``held_bytes``, measured
    from its arrays) and the formula's (``formula_bytes``)."""

    config: BudgetConfig
    p: int
    loss: float
    grad: np.ndarray
    held_bytes: np.ndarray
    formula_bytes: np.ndarray


def _rank_step(comm, config: BudgetConfig, X, y):
    """One rank's step: (loss, its part of the gradient or the whole one, bytes its part holds)."""
    from coursekit.nn import MLP
    from coursekit.parallel.pipeline.execute import stage_layers
    from coursekit.parallel.tensor_parallel import TensorParallelMLP, layer_split

    mlp = MLP(config.sizes, activation="relu", dtype=config.dtype, seed=config.seed)
    if config.strategy == "tensor parallel":
        tp = TensorParallelMLP(comm, mlp)
        loss, shards = tp.loss_and_grad(X, y)
        held = sum(W.nbytes + b.nbytes for _, W, b, _ in tp.shards)
        return loss, tp.full_grad(shards), held
    if config.strategy == "layer split":
        step = layer_split(comm, mlp, X, y)
        block = stage_layers(len(mlp.layers), comm.size)[comm.rank]
        held = sum(mlp.layers[l].W.nbytes + mlp.layers[l].b.nbytes for l in block)
        return step.loss, step.grad, held
    from coursekit.collectives import allreduce
    from coursekit.data import shard

    Xr, yr = shard(X, y, comm.rank, comm.size)
    loss, grad = mlp.loss_and_grad(Xr, yr)
    total = allreduce(comm, np.append(grad, loss) * (len(Xr) / len(X)))
    return total[-1], total[:-1], mlp.params.nbytes


def step_within_budget(runner, config: BudgetConfig, X, y) -> BudgetResult:
    """One training step of ``config`` on every rank of ``runner`` (LocalRunner or
    ClusterRunner), refused with :class:`MemoryBudgetError` before any rank starts when the
    strategy does not fit the budget (:meth:`BudgetConfig.check_fits`)."""
    from coursekit.cluster.runner import Runner

    checks.instance(runner, "runner", Runner, " (LocalRunner(n) or ClusterRunner(cluster))")
    checks.instance(config, "config", BudgetConfig)
    formula = config.check_fits(runner.size)
    X, y = checks.data_pair((X, y), "data (X, y)", features=config.sizes[0])
    outputs = runner.run(_rank_step, config, X, y)
    if config.strategy == "layer split":  # each rank filled its layers: add them up
        loss, grad = sum(o[0] for o in outputs), sum(o[1] for o in outputs)
    else:
        loss, grad = outputs[0][0], outputs[0][1]
    return BudgetResult(config, runner.size, float(loss), grad,
                        np.array([o[2] for o in outputs], np.int64), formula)
