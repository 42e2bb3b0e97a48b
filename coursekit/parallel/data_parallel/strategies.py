"""The exchange strategies: how the workers combine their work each step, and what that costs.

N workers, a gradient of n bytes, the alpha-beta-gamma model of :mod:`coursekit.costmodel`:

* **allreduce** (decentralized): every worker sums the weighted gradients with an
  allreduce and applies the same update. Ring: 2(N-1) alpha + 2 (N-1)/N n beta +
  (N-1)/N n gamma per step; every rank sends and receives 2 (N-1)/N n bytes.
* **ps** (centralized parameter server, rank 0): linear reduce of the gradients to the
  server, the server steps, linear broadcast of the parameters:
  (N-1)(alpha + n beta + n gamma) + (N-1)(alpha + n beta) = 2(N-1) alpha + 2(N-1) n beta
  + (N-1) n gamma. The server moves 2(N-1) n bytes per step, N times what a ring rank
  moves: the bottleneck the lecture warns about ("don't use parameter servers").
* **average** (parameter averaging / local SGD): each worker steps on its own gradient;
  every k steps (and after the last step) an allreduce averages the parameters, weighted
  by each worker's share of the examples since the last average: the allreduce cost
  divided by k per step. With k = 1 and plain SGD it is the same update as
  allreduce: w - lr sum_k (n_k/B) g_k = sum_k (n_k/B)(w - lr g_k).

:func:`predict_bytes_sent` is exact (it is :func:`coursekit.costmodel.traffic`). Every
rank also receives about what it sends (reduce mirrors broadcast, ring and butterfly
steps are sendrecv pairs), so :func:`predict_bytes_through` (sent + received) is twice
that, exact when the gradient splits into equal chunks, else within one element per
message.
"""

from __future__ import annotations

import numpy as np

from coursekit import checks, costmodel
from coursekit.collectives import allreduce, bcast, reduce

from .buckets import BucketReducer, make_buckets, ready_after_layer

__all__ = ["Exchange", "predict_bytes_sent", "predict_bytes_through", "predict_comm"]

PS_ROOT = 0


def check_gradient_sum(config, gradient_sum) -> None:
    """ValueError unless ``config`` allreduces whole gradients, which ``gradient_sum`` replaces."""
    if gradient_sum is not None and (config.exchange != "allreduce"
                                     or config.bucket_bytes is not None):
        raise ValueError("gradient_sum replaces the allreduce of whole gradients: it needs "
                         "exchange='allreduce' and bucket_bytes=None")


class Exchange:
    """One worker's side of the gradient exchange + update (see the module docstring).

    ``layer_done(l)`` is called by the backward pass after layer l (it launches the
    buckets that just became ready when overlapping); ``update(step, grad, weight, lr)``
    finishes the exchange and updates ``params`` (via ``optimizer``).

    ``gradient_sum``: replaces the allreduce of the weighted gradients by another way to
    sum them over the workers, built per rank as ``gradient_sum(comm, mlp)`` ->
    ``fn(weighted_grad) -> sum over ranks`` (chapter 6 plugs compressed exchanges in here);
    if ``fn`` has a ``log`` (e.g. bytes sent per step), it is returned with the rank's result.
    """

    def __init__(self, comm, config, mlp, optimizer, recorder, gradient_sum=None):
        self.comm, self.cfg, self.mlp, self.opt, self.rec = comm, config, mlp, optimizer, recorder
        check_gradient_sum(config, gradient_sum)
        self.gradient_sum = None if gradient_sum is None else gradient_sum(comm, mlp)
        self.buckets = None
        self.reducer = None
        self._seen, self._steps = 0.0, 0  # local SGD: sum of weights, steps since averaging
        if config.bucket_bytes is not None:
            self.buckets = make_buckets(mlp.n_params, mlp.dtype.itemsize, config.bucket_bytes)
            self.reducer = BucketReducer(comm, None, self.buckets, config.algorithm,
                                         record=recorder.record)
            self.ready = ready_after_layer(self.buckets, [layer.span.start for layer in mlp.layers])

    @property
    def hook_log(self) -> dict | None:
        """What the ``gradient_sum`` hook recorded on this rank (its ``log``), if anything."""
        return getattr(self.gradient_sum, "log", None)

    @property
    def overlapping(self) -> bool:
        return self.cfg.overlapping

    def begin(self, grad: np.ndarray, weight: float) -> None:
        if self.reducer is not None:  # a Python float keeps float32 buffers float32
            self.reducer.grad, self.reducer.scale = grad, float(weight)

    def layer_done(self, layer: int) -> None:
        if self.overlapping:
            for k in self.ready[layer]:
                self.reducer.launch(k)

    def update(self, step: int, grad: np.ndarray, weight: float, last: bool = False) -> None:
        """Exchange ``grad`` (this worker's mean gradient, weight n_k / B) and step."""
        mode, weight = self.cfg.exchange, float(weight)
        if mode == "allreduce":
            self._allreduce_grad(grad, weight)
            with self.rec.compute("optimizer"):
                self.opt.step(grad)
        elif mode == "ps":
            self._parameter_server(grad, weight)
        else:
            with self.rec.compute("optimizer"):
                self.opt.step(grad)
            self._seen += weight
            self._steps += 1
            if (step + 1) % self.cfg.average_every == 0 or last:
                self.average(self._seen / self._steps)
                self._seen = self._steps = 0

    def average(self, weight: float) -> None:
        """params <- sum_k weight_k params_k (an allreduce of the weighted parameters).

        weight_k is worker k's share of the examples seen since the last averaging (its
        mean n_k / B over those steps; 1/N whenever N divides B), so for k = 1 the result
        is exactly the allreduce update.
        """
        params = self.mlp.params
        with self.rec.comm():
            allreduce(self.comm, params * weight, algorithm=self.cfg.algorithm, check=False,
                      out=params)

    def _allreduce_grad(self, grad, weight):
        if self.gradient_sum is not None:
            with self.rec.comm():
                grad[...] = self.gradient_sum(grad * weight)
            return
        if self.reducer is None:
            with self.rec.compute():  # weighting the local gradient is local work
                grad *= weight
            if self.comm.size > 1:
                with self.rec.comm():
                    allreduce(self.comm, grad, algorithm=self.cfg.algorithm, check=False,
                              out=grad)
            return
        if not self.cfg.overlap:  # buckets one after the other, after the backward
            for k in range(len(self.buckets)):
                self.reducer.launch(k)
        with self.rec.comm("idle"):  # the main thread waits; the reducer records "comm"
            self.reducer.wait()

    def _parameter_server(self, grad, weight):
        params = self.mlp.params
        with self.rec.comm():
            total = reduce(self.comm, grad * weight, root=PS_ROOT, algorithm="linear",
                           check=False)
        if self.comm.rank == PS_ROOT:
            with self.rec.compute("optimizer"):
                self.opt.step(total)
        with self.rec.comm():
            params[...] = bcast(self.comm, params, root=PS_ROOT, algorithm="linear",
                                check=False)

    def close(self) -> None:
        if self.reducer is not None:
            self.reducer.close()


def _check(exchange: str, average_every) -> None:
    if exchange not in ("allreduce", "ps", "average"):
        raise ValueError(f"unknown exchange {exchange!r}; allowed: allreduce, ps, average")
    checks.integer(average_every, "average_every", at_least=1)


def _collectives(exchange: str, algorithm: str) -> list[tuple[str, str]]:
    if exchange == "ps":
        return [("reduce", "linear"), ("bcast", "linear")]
    return [("allreduce", algorithm)]


def predict_comm(exchange: str, algorithm: str, p: int, nbytes: int, alpha: float,
                 beta: float, gamma: float = 0.0, average_every: int = 1,
                 bucket_bytes: int | None = None) -> float:
    """Predicted communication seconds per step (not hidden by overlap).

    ``bucket_bytes``: allreduce the gradient in buckets of at most that size (one call
    each, so each pays the latency terms again).
    """
    _check(exchange, average_every)
    if bucket_bytes is not None:
        checks.integer(bucket_bytes, "bucket_bytes", at_least=1, hint=" or None (one piece)")
    if p == 1:
        return 0.0
    pieces = [nbytes] if bucket_bytes is None else \
        [min(bucket_bytes, nbytes - i) for i in range(0, nbytes, bucket_bytes)]
    total = sum(float(costmodel.predict(c, a, p, n, alpha, beta, gamma))
                for c, a in _collectives(exchange, algorithm) for n in pieces)
    return total / (average_every if exchange == "average" else 1)


def predict_bytes_sent(exchange: str, algorithm: str, p: int, nbytes: int, itemsize: int,
                       average_every: int = 1) -> np.ndarray:
    """Bytes each rank sends per step (averaged over k steps for "average"); exact."""
    _check(exchange, average_every)
    sent = sum(costmodel.traffic(c, a, p, nbytes, root=PS_ROOT, itemsize=itemsize).nbytes
               for c, a in _collectives(exchange, algorithm))
    return np.asarray(sent, float) / (average_every if exchange == "average" else 1)


def predict_bytes_through(exchange: str, algorithm: str, p: int, nbytes: int,
                          itemsize: int, average_every: int = 1) -> np.ndarray:
    """Bytes each rank sends plus receives per step: 2 x sent (see the module docstring)."""
    return 2 * predict_bytes_sent(exchange, algorithm, p, nbytes, itemsize, average_every)
