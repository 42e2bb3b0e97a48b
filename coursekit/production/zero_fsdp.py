"""ZeroRedundancyOptimizer and FSDP2 (``fully_shard``) beside chapter 08's ZeRO stages.

Both sides train chapter 08's run on the same engines: the MLP 64-96-64-10 (ReLU, float64,
seed 1), rows 0..767 of the digits' training set, global batches of B = 64 rows split over
the p ranks like ``np.array_split`` (:func:`coursekit.parallel.zero.step_rows`), SGD with
momentum (lr 0.1, mu 0.9; v <- mu v + g, w <- w - lr v: ``torch.optim.SGD``'s convention,
dampening 0, no Nesterov, no weight decay). Torch's model is ``nn.Sequential`` of
``Linear``/``ReLU`` with the course's weights copied in (``weight = W.T``, ``bias = b``).
What maps to what (Ψ parameters, itemsize 8):

stage 1: course ZeRO-1 (reduce-scatter the gradient, update the own shard, all-gather the
    weights: 2 (p-1)/p P_pad per rank) vs ``DistributedDataParallel`` +
    ``torch.distributed.optim.ZeroRedundancyOptimizer(SGD)``. DDP knows nothing of the
    sharding: it allreduces the whole gradient (2 (p-1)/p Ψ); the optimizer then updates
    the *whole parameters* it owns (a greedy partition by size, not a flat 1/p range) and
    broadcasts each from its owner ((p-1) x owned on the owner): on average 3 (p-1)/p Ψ per
    rank, 1.5 x the course's ZeRO-1.
stage 2: course ZeRO-2 (each layer's gradient reduce-scattered as soon as it is computed;
    weights all-gathered after the update) vs ``fully_shard(..., reshard_after_forward=
    False)`` on each Linear: a layer is all-gathered once before its forward and kept
    through its backward, its gradient reduce-scattered, the update is local to the shard:
    2 (p-1)/p P_fsdp per rank, the same two passes. (Between steps FSDP holds only the
    shard of the weights; ZeRO-2 holds them whole. FSDP1 calls this SHARD_GRAD_OP.)
stage 3: course ZeRO-3 vs ``fully_shard`` on each Linear and on the Sequential (reshard
    after forward): all-gather each layer for its forward and again for its backward,
    reduce-scatter its gradient: 3 (p-1)/p P_fsdp per rank.

Padding: the course pads each layer's flat block (W then b) to p chunks: P_pad =
p sum_l ceil(size_l / p). FSDP2 shards every parameter on dim 0 and pads that dim to a
multiple of p: P_fsdp = sum over parameters of ceil(rows / p) p (numel / rows) (torch's
``weight`` is (n_out, n_in)). Both equal Ψ when p divides every layer's width.

Bytes each rank sends per step: the course's from its trace (what its ring algorithms send);
torch's from the tensors of every c10d call (:class:`~coursekit.production.c10d_log.C10dLog`)
by the bandwidth-optimal rule of each collective. The loss is scaled so that torch's
gradient *average* over the ranks equals the course's *sum* of each rank's share of the
global mean (scale p n_r / B on rank r's local mean; 1 when B/p rows each).
"""

from __future__ import annotations

import statistics
import time
import warnings
from dataclasses import dataclass

import numpy as np

from coursekit import checks
from coursekit.comm.trace import recording
from coursekit.nn.mlp import MLP
from coursekit.parallel.zero import ShardLayout, ZeroRank, sent_bytes, step_rows

from .c10d_log import C10dLog
from .requirement import import_torch
from .torch_group import digits_or, process_group, torch_ranks

__all__ = ["CHAPTER8", "TORCH_SIDE", "ZeroFsdpConfig", "ZeroFsdpResult", "fsdp_padded",
           "zero_experiment"]

#: chapter 08 section 2's run (the model, data rows, batch and optimizer)
CHAPTER8 = dict(sizes=(64, 96, 64, 10), model_seed=1, rows=768, batch_size=64, lr=0.1,
                momentum=0.9)
#: |course - torch| allowed after a step: float64, the two sides sum in different orders
TOLERANCE = 1e-12
#: What the torch side imports (DDP, the optimizer, FSDP), once on every rank before it runs.
TORCH_MODULES = ("torch.distributed.device_mesh", "torch.distributed.fsdp",
                 "torch.distributed.optim", "torch.nn.parallel")
#: what torch runs against each course stage
TORCH_SIDE = {1: "DDP + ZeroRedundancyOptimizer(SGD)",
              2: "fully_shard(Linear, reshard_after_forward=False)",
              3: "fully_shard(Linear) + fully_shard(Sequential)"}
ITEMSIZE = 8  # float64


@dataclass(frozen=True)
class ZeroFsdpConfig:
    """One comparison: ``workers`` engines, ``steps`` steps of ZeRO ``stage`` (1, 2 or 3)
    on both sides; ``seed`` orders the data (the batches of :func:`step_rows`)."""

    workers: int = 4
    steps: int = 12
    stage: int = 3
    seed: int = 0

    def __post_init__(self):
        checks.integer(self.workers, "workers", at_least=2, at_most=CHAPTER8["batch_size"],
                       hint=" (engines; ZeRO shards over at least 2)")
        checks.integer(self.steps, "steps", at_least=1, at_most=1000)
        if not isinstance(self.stage, int) or isinstance(self.stage, bool):
            raise TypeError(f"stage must be an integer in (1, 2, 3); got {self.stage!r:.60}")
        if self.stage not in TORCH_SIDE:
            raise ValueError(f"stage={self.stage!r}: must be 1, 2 or 3 (the ZeRO stages torch "
                             f"has a counterpart for: {TORCH_SIDE})")
        checks.integer(self.seed, "seed", at_least=0)


@dataclass(frozen=True)
class ZeroFsdpResult:
    """Both sides of one run. Per step t and rank r: ``max_diff[t]`` = max over ranks and
    parameters of |course - torch| after step t; ``course_sent[t, r]`` / ``torch_sent[t, r]``
    the bytes rank r sent in step t (float64 payload; ``torch_other`` counts the bytes of
    other dtypes over the run, all ranks: DDP's one-time bucket rebuild); the formulas per
    rank; ``torch_owned[r]``: the parameter values rank r's torch optimizer updates (the
    course's rank updates ``padded_course / p``); ``*_memory[r]``: the bytes of parameters,
    gradients and optimizer state rank r holds after the last step; ``*_seconds``: the
    median time of a step on the slowest rank; ``torch_calls``: rank 0's c10d calls in the
    last step."""

    config: ZeroFsdpConfig
    torch_side: str
    n_params: int
    padded_course: int
    padded_torch: int
    max_diff: np.ndarray
    course_sent: np.ndarray
    torch_sent: np.ndarray
    course_formula: np.ndarray
    torch_formula: np.ndarray
    torch_other: int
    torch_owned: np.ndarray
    course_memory: list
    torch_memory: list
    torch_calls: dict
    course_seconds: float
    torch_seconds: float


def zero_experiment(runner, config: ZeroFsdpConfig, data=None) -> ZeroFsdpResult:
    """Run ``config`` on the first ``config.workers`` engines of ``runner`` (a
    ClusterRunner: torch's process group needs one process per rank). ``data``: (X, y),
    default chapter 08's rows of the digits (float64)."""
    checks.instance(config, "config", ZeroFsdpConfig, " (coursekit.production.zero_fsdp)")
    mlp = MLP(CHAPTER8["sizes"], dtype=np.float64, seed=CHAPTER8["model_seed"])
    X, y = mlp.check_batch(*digits_or(data, CHAPTER8["rows"] if data is None else None))
    if len(X) < CHAPTER8["batch_size"]:
        raise ValueError(f"data has {len(X)} rows; a step takes {CHAPTER8['batch_size']}")
    workers = torch_ranks(runner, config.workers, *TORCH_MODULES)
    ranks = runner.run(_compare_on_rank, config, mlp, X, y, ranks=workers)
    layout = ShardLayout.of(mlp, workers)
    stage, p = config.stage, workers
    torch_pad = fsdp_padded(CHAPTER8["sizes"], p)
    owned = np.array([r["owned"] for r in ranks])
    if stage == 1:  # allreduce of the gradient + each owned parameter broadcast by its owner
        torch_formula = (2 * (p - 1) / p * mlp.n_params + (p - 1) * owned) * ITEMSIZE
    else:
        passes = 3 if stage == 3 else 2  # all-gather (twice at stage 3) + reduce-scatter
        torch_formula = np.full(p, passes * (p - 1) / p * torch_pad * ITEMSIZE)
    return ZeroFsdpResult(
        config=config, torch_side=TORCH_SIDE[stage], n_params=mlp.n_params,
        padded_course=p * layout.width, padded_torch=torch_pad,
        max_diff=np.max([r["diff"] for r in ranks], axis=0),
        course_sent=np.array([r["course_sent"] for r in ranks]).T,
        torch_sent=np.array([r["torch_sent"] for r in ranks]).T,
        course_formula=np.full(p, sent_bytes(stage, mlp.n_params, layout, ITEMSIZE) / p),
        torch_formula=torch_formula,
        torch_other=int(sum(r["torch_other"] for r in ranks)), torch_owned=owned,
        course_memory=[r["course_memory"] for r in ranks],
        torch_memory=[r["torch_memory"] for r in ranks],
        torch_calls=ranks[0]["calls"],
        course_seconds=max(statistics.median(r["course_times"]) for r in ranks),
        torch_seconds=max(statistics.median(r["torch_times"]) for r in ranks))


def fsdp_padded(sizes, p: int) -> int:
    """P_fsdp: the elements FSDP2 gathers for the MLP ``sizes`` over p ranks. Each Linear's
    weight (n_out, n_in) and bias (n_out,) are padded on dim 0 to ceil(n_out / p) p rows."""
    rows = [-(-n_out // p) * p for n_out in sizes[1:]]
    return sum(r * n_in + r for r, n_in in zip(rows, sizes[:-1]))


# -- on each rank ------------------------------------------------------------------------
def _compare_on_rank(comm, config: ZeroFsdpConfig, mlp: MLP, X, y) -> dict:
    """Both sides on this rank: the course's ZeroRank, then torch in a gloo process group."""
    B = CHAPTER8["batch_size"]
    rows = step_rows(len(X), B, config.seed, comm.rank, comm.size)
    rank = ZeroRank(comm, mlp, config.stage, CHAPTER8["lr"], CHAPTER8["momentum"])
    course = {"sent": [], "times": [], "params": []}
    comm.barrier()
    for t in range(config.steps):
        mine = rows(t)
        with recording(comm) as messages:
            start = time.perf_counter()
            rank.step(X[mine], y[mine], B)
            course["times"].append(time.perf_counter() - start)
            course["sent"].append(sum(m.nbytes for m in messages() if m.op == "send"))
        course["params"].append(rank.full_params())  # stage 3 gathers: outside the count
    out = _torch_side(comm, config, mlp, X, y, rows)
    out["diff"] = [float(np.abs(a - b).max()) for a, b in zip(course["params"], out.pop("params"))]
    out.update(course_sent=course["sent"], course_times=course["times"],
               course_memory=rank.memory())
    return out


def _torch_side(comm, config, mlp: MLP, X, y, rows) -> dict:
    torch = import_torch()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the engines share the cores; the course's kernels use one too
    try:
        with process_group(comm, "gloo"), warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*(FSDP2-wrapped|Full backward hook)")
            return _train_torch(comm, config, mlp, X, y, rows)
    finally:
        torch.set_num_threads(threads)


def _sequential(mlp: MLP):
    """torch's twin of ``mlp`` (float64): Linear/ReLU with weight = W.T, bias = b."""
    torch = import_torch()
    modules = []
    for layer in mlp.layers:
        n_in, n_out = layer.W.shape
        linear = torch.nn.Linear(n_in, n_out, dtype=torch.float64)
        with torch.no_grad():
            linear.weight.copy_(torch.from_numpy(layer.W.T.copy()))
            linear.bias.copy_(torch.from_numpy(layer.b.copy()))
        modules += [linear] if layer.activation == "identity" else [linear, torch.nn.ReLU()]
    return torch.nn.Sequential(*modules)


def _flat(model) -> np.ndarray:
    """The model's weights in the course's flat layout (W = weight.T, then b, per layer);
    FSDP's sharded parameters are gathered (a collective: every rank calls it)."""
    parts = []
    for module in model:
        if hasattr(module, "weight"):
            for p, transpose in ((module.weight, True), (module.bias, False)):
                full = p.full_tensor() if hasattr(p, "full_tensor") else p
                full = full.detach().numpy()
                parts.append((full.T if transpose else full).ravel())
    return np.concatenate(parts)


def _wrap(model, stage: int, lr: float, momentum: float):
    """(module to call, optimizer, elements of the parameters this rank's optimizer owns)."""
    torch = import_torch()
    sgd = dict(lr=lr, momentum=momentum)
    if stage == 1:
        from torch.distributed.optim import ZeroRedundancyOptimizer
        from torch.nn.parallel import DistributedDataParallel
        ddp = DistributedDataParallel(model)
        optimizer = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.SGD,
                                            **sgd)
        owned = sum(p.numel() for g in optimizer.optim.param_groups for p in g["params"])
        return ddp, optimizer, owned
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    mesh = init_device_mesh("cpu", (torch.distributed.get_world_size(),))
    for module in model:
        if isinstance(module, torch.nn.Linear):
            fully_shard(module, mesh=mesh, reshard_after_forward=stage == 3)
    fully_shard(model, mesh=mesh, reshard_after_forward=stage == 3)
    owned = sum(p.to_local().numel() for p in model.parameters())
    return model, torch.optim.SGD(model.parameters(), **sgd), owned


def _held(model, optimizer) -> dict[str, int]:
    """Bytes of the model states this rank holds after a step (FSDP: its local shards), by
    the course's categories (:meth:`ZeroRank.memory`)."""
    def local(t):
        t = t.to_local() if hasattr(t, "to_local") else t
        return t.numel() * t.element_size()
    local_optimizer = getattr(optimizer, "optim", optimizer)  # ZeroRedundancyOptimizer's own
    return {"params": sum(local(p) for p in model.parameters()),
            "grads": sum(local(p.grad) for p in model.parameters() if p.grad is not None),
            "optimizer": sum(local(v) for state in local_optimizer.state.values()
                             for v in state.values() if hasattr(v, "numel"))}


def _train_torch(comm, config, mlp: MLP, X, y, rows) -> dict:
    torch = import_torch()
    B = CHAPTER8["batch_size"]
    model = _sequential(mlp)
    module, optimizer, owned = _wrap(model, config.stage, CHAPTER8["lr"], CHAPTER8["momentum"])
    out = {"owned": owned, "torch_sent": [], "torch_times": [], "params": [], "torch_other": 0}
    comm.barrier()
    for t in range(config.steps):
        mine = rows(t)
        xb, yb = torch.from_numpy(X[mine]), torch.from_numpy(y[mine]).long()
        scale = comm.size * len(mine) / B  # the average over ranks is the global mean
        with C10dLog() as log:
            start = time.perf_counter()
            optimizer.zero_grad()  # first: the last step's gradients stay for _held
            loss = torch.nn.functional.cross_entropy(module(xb), yb) * scale
            loss.backward()
            optimizer.step()
            out["torch_times"].append(time.perf_counter() - start)
        out["torch_sent"].append(log.sent("float64"))
        out["torch_other"] += int(log.sent() - log.sent("float64"))
        out["params"].append(_flat(model))
    out["calls"] = log.counts()
    out["torch_memory"] = _held(model, optimizer)
    return out
