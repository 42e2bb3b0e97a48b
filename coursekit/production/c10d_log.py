"""Count what torch.distributed's collectives send: the tensors each c10d call carries.

    with C10dLog() as log:          # on every rank, inside process_group(comm)
        loss.backward(); optimizer.step()
    log.sent()                      # bytes this rank sends, by the rules below

Every collective of ``torch.distributed`` (DDP's gradient buckets, ZeroRedundancyOptimizer's
broadcasts, FSDP's all-gathers and reduce-scatters) is a ``c10d`` operator that goes through
PyTorch's dispatcher, so a :class:`~torch.utils._python_dispatch.TorchDispatchMode` sees
each call with its real tensors. (``torch.distributed.tensor.debug.CommDebugMode`` sees the
same calls but only counts them; this log keeps their sizes.) The log cannot see gloo's
wire, so the bytes a rank *sends* follow from the payload n (bytes of the whole vector) and
the group size p by the bandwidth-optimal algorithm of each collective (chapter 02):

    allreduce            2 (p-1)/p n   (ring: a reduce-scatter, then an all-gather)
    all-gather           (p-1)/p n     (n: the gathered output; each rank sends its
    reduce-scatter       (p-1)/p n      piece to p-1 ranks / receives p-1 partial sums)
    broadcast from root  (p-1) n on the root, 0 elsewhere (gloo: the root sends to each)

Only the calls made in this thread while the block runs are logged (CPU autograd runs the
backward, and its hooks, in the calling thread).
"""

from __future__ import annotations

from dataclasses import dataclass

from .requirement import import_torch

__all__ = ["C10dCall", "C10dLog"]


@dataclass(frozen=True)
class C10dCall:
    """One collective as one rank saw it: the c10d op, the dtype of its tensors, the
    payload n (bytes of the whole vector) and the bytes this rank sends for it."""

    op: str
    dtype: str
    payload: int
    sent: float


def _tensors(value) -> list:
    torch = import_torch()
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for item in value for t in _tensors(item)]
    return []


def _nbytes(value) -> int:
    return sum(t.numel() * t.element_size() for t in _tensors(value))


def _call(op: str, args, rank: int, p: int) -> C10dCall:
    """The rules of the module docstring, by the c10d schema of each op."""
    dtype = str(_tensors(args)[0].dtype).removeprefix("torch.")
    if op == "allreduce_":                                  # (tensors, group, op, ...)
        n = _nbytes(args[0])
        return C10dCall(op, dtype, n, 2 * (p - 1) / p * n)
    if op in ("_allgather_base_", "allgather_", "allgather_into_tensor_coalesced_"):
        n = _nbytes(args[0])                                # (output(s), input(s), ...)
        return C10dCall(op, dtype, n, (p - 1) / p * n)
    if op in ("_reduce_scatter_base_", "reduce_scatter_", "reduce_scatter_tensor_coalesced_"):
        n = _nbytes(args[1])                                # (output(s), input(s), ...)
        return C10dCall(op, dtype, n, (p - 1) / p * n)
    if op == "broadcast_":                                  # (tensors, group, root, ...)
        n = _nbytes(args[0])
        return C10dCall(op, dtype, n, float((p - 1) * n) if args[2] == rank else 0.0)
    raise NotImplementedError(f"C10dLog has no byte rule for c10d.{op}")


class C10dLog:
    """The c10d collectives this rank calls while the block runs (see the module docstring)."""

    def __init__(self):
        torch = import_torch()
        from torch.utils._python_dispatch import TorchDispatchMode

        log = self
        self.calls: list[C10dCall] = []
        self._rank = torch.distributed.get_rank()
        self._size = torch.distributed.get_world_size()

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                if func.namespace == "c10d" and not func.name().startswith("c10d::barrier"):
                    name = func.name().removeprefix("c10d::")
                    log.calls.append(_call(name, args, log._rank, log._size))
                return func(*args, **(kwargs or {}))

        self._mode = _Mode()

    def __enter__(self) -> "C10dLog":
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)

    def sent(self, dtype: str | None = None) -> float:
        """Bytes this rank sends over the logged calls (only those of ``dtype`` if given)."""
        return sum(c.sent for c in self.calls if dtype is None or c.dtype == dtype)

    def counts(self) -> dict[str, int]:
        """How many calls of each op."""
        out: dict[str, int] = {}
        for c in self.calls:
            out[c.op] = out.get(c.op, 0) + 1
        return out
