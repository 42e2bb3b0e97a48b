"""Gradient buckets on the flat buffer, and a background reducer that overlaps them.

The backward pass produces the gradient from the last layer to the first, i.e. from the
END of the flat buffer ``[W_1 b_1 | W_2 b_2 | ... | W_L b_L]`` towards its start
(:mod:`coursekit.nn.layout`). Like PyTorch DDP and Horovod, we cut the buffer into
buckets of at most ``bucket_bytes`` bytes, counted from the end, so bucket 0 holds the last
layer's gradient and is ready first. A bucket ``[a, b)`` is ready as soon as every layer
it overlaps has finished its backward pass, i.e. when the layer containing element ``a``
is done.

Overlap: :class:`BucketReducer` owns a background thread that allreduces the buckets in
the order they are launched while the main thread keeps computing the earlier layers'
gradients (Horovod's background thread; DDP's communication stream). With b buckets of
n/b bytes the step costs about

    t_step ~ t_forward + max(t_backward, sum_k t_allreduce(n/b)) + (last bucket's allreduce)

instead of t_forward + t_backward + t_allreduce(n): communication hides behind compute,
at the price of b times the latency term alpha (smaller buckets overlap better but pay
more alpha; that is the trade-off the notebook's bucket slider shows).
"""

from __future__ import annotations

import queue
import threading

import numpy as np

from coursekit import checks
from coursekit.collectives import allreduce
from coursekit.comm.trace import now

__all__ = ["BucketReducer", "make_buckets", "ready_after_layer"]

def make_buckets(n_params: int, itemsize: int, bucket_bytes: int) -> list[slice]:
    """Slices of at most ``bucket_bytes`` bytes of a flat buffer, from its END backwards.

    Bucket 0 is the last slice of the buffer (the last layer's gradient, ready first).
    Every bucket holds at least one element. ValueError for a size < 1.
    """
    checks.integer(bucket_bytes, "bucket_bytes", at_least=1, hint=" (bytes, e.g. 262144 for "
                   "256 KiB; use bucket_bytes=None to send the gradient in one piece)")
    checks.integer(itemsize, "itemsize", at_least=1)
    per_bucket = max(1, bucket_bytes // itemsize)
    bounds = list(range(n_params, 0, -per_bucket)) + [0]
    return [slice(lo, hi) for hi, lo in zip(bounds[:-1], bounds[1:])]


def ready_after_layer(buckets: list[slice], layer_starts: list[int]) -> list[list[int]]:
    """For each layer l (0-based), the buckets that become ready when its backward ends.

    ``layer_starts[l]`` is layer l's first element in the flat buffer. The backward runs
    l = L-1 .. 0, and bucket k is ready after the layer that contains ``buckets[k].start``.
    """
    ready: list[list[int]] = [[] for _ in layer_starts]
    for k, bucket in enumerate(buckets):
        layer = max(i for i, start in enumerate(layer_starts) if start <= bucket.start)
        ready[layer].append(k)
    return ready


class BucketReducer:
    """Allreduce (sum) slices of ``grad`` in place on a background thread, in launch order.

    ``launch(k)`` queues bucket k (it is multiplied by ``scale`` first: the worker's weight
    n_r / B); ``wait()`` blocks until every launched bucket is done and re-raises the first
    error the thread hit (e.g. a CommTimeout naming the peer). The Comm is used only by the
    thread while buckets are in flight. ``record(kind, t_start, t_end)`` (e.g.
    :meth:`~coursekit.parallel.spans.SpanRecorder.record`) gets each bucket's allreduce.
    Call :meth:`close` when done (or use ``with``).
    """

    def __init__(self, comm, grad: np.ndarray, buckets: list[slice], algorithm: str,
                 record=None):
        self.comm, self.grad, self.buckets, self.algorithm = comm, grad, buckets, algorithm
        self.record = record  # record(kind, t0, t1), called from the thread
        self.scale = 1.0
        self._todo: queue.Queue = queue.Queue()
        self._done = threading.Semaphore(0)
        self._launched = 0
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"bucket-reducer-{comm.rank}",
                                        daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            k = self._todo.get()
            if k is None:
                return
            if self._error is None:
                try:
                    t0 = now()
                    part = self.grad[self.buckets[k]]
                    part *= self.scale
                    allreduce(self.comm, part, algorithm=self.algorithm, check=False, out=part)
                    if self.record is not None:
                        self.record("comm", t0, now())
                except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                    self._error = exc
            self._done.release()

    def launch(self, k: int) -> None:
        self._launched += 1
        self._todo.put(k)

    def wait(self) -> None:
        """Block until every launched bucket is reduced (the thread stops at the comm timeout)."""
        limit = self.comm.timeout + 5.0  # every call of the thread gives up at the comm timeout
        for _ in range(self._launched):
            if not self._done.acquire(timeout=limit):
                raise TimeoutError(f"rank {self.comm.rank}: the bucket reducer did not finish "
                                   f"within {limit:g} s")
        self._launched = 0
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def close(self) -> None:
        self._todo.put(None)
        self._thread.join(self.comm.timeout + 5.0)

    def __enter__(self) -> "BucketReducer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
