"""Model parallelism inside a layer (Megatron-LM tensor parallelism) and across layers.

A layer computes Z = A W + b with W of shape (n_in, n_out) (:mod:`coursekit.nn.layout`).
It can be split over p ranks two ways:

* **column-parallel** (split the outputs): rank r holds columns W_r (n_out/p of them) and
  b_r. The input A is replicated; rank r computes its slice of the output,
  A_r^out = sigma(A W_r + b_r), with no communication (sigma is elementwise). Backward:
  each rank has a partial input gradient delta_r W_r^T, and dC/dA = sum_r delta_r W_r^T
  needs an **allreduce** (Megatron's ``f`` operator). If the next layer needs the whole
  output, an **allgather** concatenates the slices.
* **row-parallel** (split the inputs): rank r holds rows W_r (n_in/p of them) and gets the
  matching slice A_r of the input, exactly what a column-parallel layer produces.
  Z = sum_r A_r W_r + b needs an **allreduce** in the forward; the backward needs none:
  dC/dA_r = delta W_r^T stays local, dW_r = A_r^T delta, db = sum(delta) (replicated).

Megatron pairs them (column then row), so a two-layer block costs one allreduce forward and
one backward. The products (A W_r, delta W_r^T, A_r^T delta) run on the MLP's device, through
its layers' kernels (:class:`coursekit.nn.mlp.Layer`): on the GPU for ``device="cuda"``.
What stays on the host: the collectives (the Comm sends host arrays), a row layer's
``+ b`` and sigma after its allreduce, and the loss at the output (elementwise work on
n x n_out numbers). :class:`TensorParallelMLP` alternates column, row, column, ... over the MLP;
an odd last (column) layer allgathers its output. :func:`layer_split` is the naive
alternative: whole layers per rank, i.e. a pipeline with one micro-batch.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from coursekit import checks
from coursekit.collectives import allgather, allreduce
from coursekit.collectives._base import check_comm
from coursekit.nn import activations, layout, reference
from coursekit.nn.mlp import MLP

from .pipeline import execute, schedule


def _split(n: int, p: int, what: str) -> int:
    if n % p:
        allowed = [d for d in range(1, n + 1) if n % d == 0]
        raise ValueError(f"{what}={n} cannot be split evenly over {p} ranks; "
                         f"allowed rank counts: {allowed}")
    return n // p


class TensorParallelMLP:
    """This rank's shards of ``mlp``: layer l is column-parallel for even l, row-parallel for odd l.

    Column layers need n_out, row layers n_in (the same width) divisible by ``comm.size``.
    The shards are views of ``mlp``'s parameters (each rank would hold only its own).
    ``device``: where this rank computes ("cpu" or "cuda:<id>", ``mlp.device_name``).
    """

    def __init__(self, comm, mlp):
        check_comm(comm)
        checks.instance(mlp, "mlp", MLP, " (coursekit.nn.MLP)")
        self.comm, self.mlp, p, r = comm, mlp, comm.size, comm.rank
        self.shards = []  # (kind, W_r, b_r or b, activation)
        for layer in mlp.layers:
            n_in, n_out = layer.W.shape
            if layer.index % 2 == 0:
                k = _split(n_out, p, f"layer {layer.index} is column-parallel: its n_out")
                self.shards.append(("column", layer.W[:, r * k:(r + 1) * k], layer.b[r * k:(r + 1) * k],
                                    layer.activation))
            else:
                k = _split(n_in, p, f"layer {layer.index} is row-parallel: its n_in")
                self.shards.append(("row", layer.W[r * k:(r + 1) * k], layer.b, layer.activation))
        self.device = mlp.device_name

    def _layer(self, l: int, **changes):
        """Shard l as a Layer on the MLP's kernels (``changes``: fields to replace)."""
        _, W, b, _ = self.shards[l]
        fields = {"W": np.ascontiguousarray(W), "b": np.ascontiguousarray(b), **changes}
        return dataclasses.replace(self.mlp.layers[l], **fields)
    def forward(self, X) -> tuple[list[np.ndarray], np.ndarray]:
        """(this rank's activations [A^0 = X, A^1, ...], the whole output on every rank)."""
        acts = [self.mlp.check_inputs(X)]
        for l, (kind, W, b, act) in enumerate(self.shards):
            if kind == "column":
                acts.append(self._layer(l).forward(acts[-1]))
            else:  # A_r W_r on the device (no bias, no sigma), summed over the ranks
                partial = self._layer(l, b=np.zeros_like(b), activation="identity").forward(acts[-1])
                acts.append(activations.apply(allreduce(self.comm, partial) + b, act))
        if self.shards[-1][0] == "row":
            return acts, acts[-1]
        # a column-parallel last layer: the loss needs every output, so gather the slices
        return acts, allgather(self.comm, np.ascontiguousarray(acts[-1].T)).T

    def loss_and_grad(self, X, y) -> tuple[float, list[tuple[np.ndarray, np.ndarray]]]:
        """(batch loss, [(dW_r, db_r) per layer]): this rank's shards of the gradient."""
        X, y = self.mlp.check_batch(X, y)
        acts, out = self.forward(X)
        loss_fn = reference.softmax_xent if self.mlp.loss == "softmax_xent" else reference.mse
        loss, g = loss_fn(out, y)
        p, r = self.comm.size, self.comm.rank
        if self.shards[-1][0] == "column":  # back from the gathered output to this rank's slice
            k = g.shape[1] // p
            g = g[:, r * k:(r + 1) * k]
        grads = []
        for l in reversed(range(len(self.shards))):
            kind, W = self.shards[l][:2]
            g_prev, flat = self._layer(l).backward(acts[l], acts[l + 1], g, input_grad=l > 0)
            dW, db = flat[:W.size].reshape(W.shape), flat[W.size:]
            if kind == "column" and l > 0:  # partial sums of dC/dA over the split outputs
                g_prev = allreduce(self.comm, g_prev)
            grads.append((dW, db))
            g = g_prev
        return loss, grads[::-1]

    def full_grad(self, grads) -> np.ndarray:
        """Assemble every rank's shards into the MLP's flat gradient layout (allgather)."""
        out = np.empty_like(self.mlp.params)
        for (kind, *_), (dW, db), (W_full, b_full) in zip(
                self.shards, grads, layout.views(out, self.mlp.sizes)):
            if kind == "column":  # allgather concatenates rows: gather W^T's rows
                W_full[...] = allgather(self.comm, np.ascontiguousarray(dW.T)).T
                b_full[...] = allgather(self.comm, db)
            else:
                W_full[...] = allgather(self.comm, dW)
                b_full[...] = db
        return out


def layer_split(comm, mlp, X, y):
    """Naive model parallelism: rank r holds the r-th block of layers and the whole batch goes
    through them one rank at a time (a pipeline with one micro-batch, so p-1 of p ranks idle).
    Returns :class:`~coursekit.parallel.pipeline.StepResult` (this rank's layers' gradient)."""
    return execute(comm, schedule("gpipe", comm.size, 1), mlp, X, y)
