"""ZeRO: data-parallel training with the model states sharded over the N ranks.

Plain data parallelism (stage 0) keeps everything on every rank: Ψ parameters, Ψ
gradients and the optimizer's state (K values per parameter: 1 for momentum), and
allreduces the gradient: 2(N-1)/N Ψ sent per rank. ZeRO (Rajbhandari et al., 2020)
removes the redundancy stage by stage, on the flat parameter buffer:

* stage 1 (optimizer states): rank r updates only its shard, 1/N of the buffer; it keeps
  the optimizer state of that shard and a master copy of its weights (in mixed precision
  that copy is the fp32 master every rank keeps anyway; in this float32/64 code it is what
  sharding the optimizer costs). Step:
  reduce-scatter the gradient (rank r gets the summed shard r), update the shard,
  all-gather the weights: (N-1)/N Ψ + (N-1)/N Ψ, the volume of one allreduce.
* stage 2 (+ gradients): the same messages, but each layer's gradient is reduce-scattered
  as soon as the backward has computed it, so no rank ever holds a whole gradient: Ψ/N.
* stage 3 (+ parameters; PyTorch's FSDP): no rank holds the whole weights either. Each
  layer's weights are all-gathered just before its forward, freed after it, gathered
  again for its backward and freed again; the summed gradient is reduce-scattered into
  the shard and the update stays local: 3 (N-1)/N Ψ, 1.5 x an allreduce.

Sharding (FSDP's flat-parameter view): each layer's block (W then b, its ``span`` in the
flat buffer) is padded with zeros to N equal chunks of c_l = ceil(size_l / N); rank r's
shard is chunk r of every layer, concatenated: C = sum_l c_l values, P_pad = N C >= Ψ.
Padded entries have zero gradient and stay zero. So the memory a rank holds between steps
(itemsize bytes per value, k = optimizer buffers: 0 SGD, 1 momentum) is

    stage 0: params Ψ      grads Ψ      optimizer k Ψ
    stage 1: params Ψ      grads Ψ      optimizer (1 + k) C   (master shard + state)
    stage 2: params Ψ      grads C      optimizer (1 + k) C
    stage 3: params C      grads C      optimizer k C         (the shard is the weights)

and the bytes all ranks send per step are 2 (N-1) Ψ (stage 0, ring allreduce),
2 (N-1) P_pad (stages 1, 2) and 3 (N-1) P_pad (stage 3), times the itemsize.
Every stage computes the same step as serial training on the global batch (the tests
check it step by step in float64).

Devices: each layer's forward and backward run on the MLP's device (its
:class:`~coursekit.nn.mlp.Layer` kernels: the GPU for ``device="cuda"``, each rank on its
engine's GPU); the flat buffers, the collectives, the loss at the output and the optimizer
step stay on the host, where the Comm sends from.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np

from coursekit import checks
from coursekit.collectives import allgather, allreduce, reduce_scatter
from coursekit.comm.trace import recording
from coursekit.nn import reference
from coursekit.nn.mlp import MLP
from coursekit.nn.optim import make_optimizer

__all__ = ["STAGES", "ShardLayout", "ZeroRank", "ZeroResult", "state_bytes", "sent_bytes",
           "step_rows", "train_zero"]

STAGES = (0, 1, 2, 3)


@dataclass(frozen=True)
class ShardLayout:
    """Where rank r's shard of each layer lives (see the module docstring)."""

    spans: tuple      # each layer's slice of the flat buffer
    chunks: tuple     # c_l: each layer's chunk length
    offsets: tuple    # where each layer's chunk starts in a shard (and C at the end)
    n_ranks: int

    @classmethod
    def of(cls, mlp: MLP, n_ranks: int) -> "ShardLayout":
        spans = tuple(layer.span for layer in mlp.layers)
        chunks = tuple(-(-(s.stop - s.start) // n_ranks) for s in spans)
        return cls(spans, chunks, (0, *np.cumsum(chunks).tolist()), n_ranks)

    @property
    def width(self) -> int:
        """C: values in one rank's shard."""
        return self.offsets[-1]

    def padded(self, layer: int, values: np.ndarray) -> np.ndarray:
        """One layer's flat block (``values``) as an (N, c_l) array, zero-padded."""
        rows = np.zeros((self.n_ranks, self.chunks[layer]), values.dtype)
        rows.reshape(-1)[:values.size] = values
        return rows

    def rows(self, flat: np.ndarray) -> np.ndarray:
        """The flat buffer as an (N, C) array whose row r is rank r's shard."""
        out = np.empty((self.n_ranks, self.width), flat.dtype)
        for l, (span, lo, hi) in enumerate(zip(self.spans, self.offsets, self.offsets[1:])):
            out[:, lo:hi] = self.padded(l, flat[span])
        return out

    def unpad(self, layer: int, gathered: np.ndarray) -> np.ndarray:
        """A layer's block from its N gathered chunks (rank order)."""
        span = self.spans[layer]
        return gathered.reshape(-1)[:span.stop - span.start]

    def flat_into(self, rows: np.ndarray, flat: np.ndarray) -> None:
        """Inverse of :meth:`rows`: write the (N, C) array back into the flat buffer."""
        for l, (span, lo, hi) in enumerate(zip(self.spans, self.offsets, self.offsets[1:])):
            flat[span] = self.unpad(l, np.ascontiguousarray(rows[:, lo:hi]))


class ZeroRank:
    """One rank's part of ZeRO training of ``mlp`` (every rank passes an equal MLP)."""

    def __init__(self, comm, mlp: MLP, stage: int, lr: float, momentum: float = 0.0):
        checks.instance(mlp, "mlp", MLP, " (coursekit.nn.MLP)")
        if stage not in STAGES:
            raise ValueError(f"stage={stage!r} is not a ZeRO stage; allowed: {STAGES}")
        self.comm, self.stage = comm, stage
        self.layout = ShardLayout.of(mlp, comm.size)
        self.loss_fn = reference.softmax_xent if mlp.loss == "softmax_xent" else reference.mse
        # stages 0-2: this rank's own copy of the whole model; stage 3: only its layers'
        # shapes and activations (their weights are gathered when used)
        self._model = mlp.copy() if stage < 3 else mlp
        self.params = self._model.params if stage < 3 else None
        self.grad = np.zeros(mlp.n_params, mlp.dtype) if stage < 2 else None
        if stage == 0:
            self.shard = self.shard_grad = None
            self.optimizer = make_optimizer(self.params, lr, momentum)
        else:
            self.shard = self.layout.rows(mlp.params)[comm.rank].copy()
            self.shard_grad = np.zeros_like(self.shard)
            self.optimizer = make_optimizer(self.shard, lr, momentum)

    # -- one step ------------------------------------------------------------------------
    def step(self, X: np.ndarray, y: np.ndarray, n_global: int) -> float:
        """One training step on this rank's rows (X, y) of a global batch of ``n_global``
        rows; returns this rank's part of the global batch loss."""
        X, y = self._model.check_batch(X, y)
        acts = [X]
        for l in range(len(self.layout.spans)):
            acts.append(self._layer(l).forward(acts[-1]))
        weight = len(X) / n_global
        loss, g = self.loss_fn(acts[-1], y)
        g = g * weight
        for l in reversed(range(len(self.layout.spans))):
            layer = self._layer(l)
            whole = self.grad[layer.span] if self.stage < 2 else None  # written in place
            g, layer_grad = layer.backward(acts[l], acts[l + 1], g, grad=whole, input_grad=l > 0)
            if self.stage >= 2:
                self._scatter_gradient(l, layer_grad)
        self._update()
        return loss * weight

    def _layer(self, l: int):
        """Layer l with its weights: the rank's own (stages 0-2) or all-gathered (stage 3)."""
        layer = self._model.layers[l]
        if self.stage < 3:
            return layer
        lo, hi = self.layout.offsets[l], self.layout.offsets[l + 1]
        block = self.layout.unpad(l, allgather(self.comm, self.shard[lo:hi], "ring", check=False))
        return dataclasses.replace(layer, W=block[:layer.W.size].reshape(layer.W.shape),
                                   b=block[layer.W.size:])

    def _scatter_gradient(self, l: int, layer_grad: np.ndarray) -> None:
        """Stages 2-3: sum layer l's gradient over the ranks into this rank's shard."""
        lo, hi = self.layout.offsets[l], self.layout.offsets[l + 1]
        self.shard_grad[lo:hi] = reduce_scatter(self.comm, self.layout.padded(l, layer_grad),
                                                algorithm="ring", check=False)[0]

    def _update(self) -> None:
        comm, layout = self.comm, self.layout
        if self.stage == 0:
            self.grad[...] = allreduce(comm, self.grad, algorithm="ring", check=False)
            self.optimizer.step(self.grad)
            return
        if self.stage == 1:
            self.shard_grad[...] = reduce_scatter(comm, layout.rows(self.grad), algorithm="ring",
                                                  check=False)[0]
        self.optimizer.step(self.shard_grad)
        if self.stage < 3:
            gathered = allgather(comm, self.shard, "ring", check=False)
            layout.flat_into(gathered.reshape(comm.size, layout.width), self.params)

    # -- what a rank holds -----------------------------------------------------------------
    def full_params(self) -> np.ndarray:
        """The whole flat parameter buffer (stage 3 all-gathers it: every rank must call)."""
        if self.stage < 3:
            return self.params.copy()
        out = np.empty(self._model.n_params, self.shard.dtype)
        gathered = allgather(self.comm, self.shard, "ring", check=False)
        self.layout.flat_into(gathered.reshape(self.comm.size, self.layout.width), out)
        return out

    def memory(self) -> dict[str, int]:
        """Bytes of the model states this rank holds between steps, by category."""
        state = getattr(self.optimizer, "velocity", None)
        master = self.shard.nbytes if self.stage in (1, 2) else 0
        return {"params": (self.params if self.stage < 3 else self.shard).nbytes,
                "grads": (self.grad if self.stage < 2 else self.shard_grad).nbytes,
                "optimizer": master + (state.nbytes if state is not None else 0)}


def state_bytes(stage: int, n_params: int, layout: ShardLayout, itemsize: int,
                state_buffers: int) -> dict[str, int]:
    """The module docstring's memory table: bytes per rank for one stage."""
    whole, shard = n_params * itemsize, layout.width * itemsize
    return {"params": shard if stage == 3 else whole,
            "grads": whole if stage < 2 else shard,
            "optimizer": (state_buffers * whole if stage == 0 else
                          (1 + state_buffers) * shard if stage < 3 else state_buffers * shard)}


def sent_bytes(stage: int, n_params: int, layout: ShardLayout, itemsize: int) -> int:
    """Bytes all ranks send per step: 2(N-1)Ψ, 2(N-1)P_pad, 2(N-1)P_pad, 3(N-1)P_pad."""
    n = layout.n_ranks
    padded = n * layout.width
    per_pass = (n - 1) * (n_params if stage == 0 else padded) * itemsize
    return (3 if stage == 3 else 2) * per_pass


@dataclass(frozen=True)
class ZeroResult:
    """One rank's view of a run: the final flat parameters, the global batch loss per step
    (this rank's share), the model-state bytes it held, the bytes it sent and where its
    layers computed ("cpu" or "cuda:<id>", :attr:`coursekit.nn.MLP.device_name`)."""

    params: np.ndarray
    losses: np.ndarray
    memory: dict
    sent: int
    device: str = "cpu"


def step_rows(n_rows: int, batch_size: int, seed: int, rank: int, n_ranks: int):
    """``rows(t)``: the rows of the data that ``rank`` of ``n_ranks`` takes at step t.

    Step t's global batch is rows ``order[t*B:(t+1)*B]`` of a seeded permutation (B =
    batch_size, wrapping around after each epoch), split over the ranks like
    ``np.array_split``: the batches a serial run takes.
    """
    order = np.random.default_rng(seed).permutation(n_rows)
    per_epoch = n_rows // batch_size

    def rows(t: int) -> np.ndarray:
        start = (t % per_epoch) * batch_size
        return np.array_split(order[start:start + batch_size], n_ranks)[rank]
    return rows


def train_zero(comm, mlp: MLP, X, y, *, stage: int, steps: int, batch_size: int, lr: float,
               momentum: float = 0.0, seed: int = 0) -> ZeroResult:
    """``steps`` steps of ZeRO ``stage`` on this rank; every rank passes the same arguments.

    Step t uses this rank's part of batch t (:func:`step_rows`): the batches a serial run
    takes.
    """
    checks.instance(mlp, "mlp", MLP, " (coursekit.nn.MLP)")
    X, y = mlp.check_batch(X, y)
    steps = checks.integer(steps, "steps", at_least=1)
    batch_size = checks.integer(batch_size, "batch_size", at_least=comm.size)
    if batch_size > len(X):
        raise ValueError(f"batch_size={batch_size} is larger than the data ({len(X)} rows)")
    rank = ZeroRank(comm, mlp, stage, lr, momentum)
    rows = step_rows(len(X), batch_size, seed, comm.rank, comm.size)
    losses = np.empty(steps)
    with recording(comm) as messages:
        for t in range(steps):
            mine = rows(t)
            losses[t] = rank.step(X[mine], y[mine], batch_size)
        sent = sum(m.nbytes for m in messages() if m.op == "send")
    return ZeroResult(rank.full_params(), losses, rank.memory(), sent, mlp.device_name)
