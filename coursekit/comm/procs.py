"""run_procs: run an SPMD function on n OS processes connected by ZmqComm.

The process-level twin of ``run_local``: every rank is a fresh Python process (the
'spawn' start method), so the ranks really exchange bytes over TCP loopback. It is the
smallest launcher of the two-phase ZmqComm setup (bind, gather addresses, connect), used
by the tests and the benchmarks. ``fn`` must be an importable module-level function;
arguments and results travel over multiprocessing queues (the launcher's control channel,
not the Comm path).
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import secrets
import traceback

from coursekit import checks

from .errors import CommError, add_rank
from .trace import now

_START_TIMEOUT = 60.0  # seconds for n fresh interpreters to import numpy + zmq and bind


def run_procs(fn, n: int, *args, timeout: float = 30.0, trace: bool = False,
              interface: str = "127.0.0.1", may_die=(), shared_memory: bool = True,
              **kwargs) -> list:
    """Run ``fn(comm, *args, **kwargs)`` on ``n`` processes; return the results in rank order.

    Raises the first rank's exception (with its rank) if one fails, CommError if a process
    dies without answering or the run exceeds ``timeout`` after startup. Ranks in
    ``may_die`` are allowed to die after startup (fault experiments): their result is None.
    ``shared_memory=False`` keeps every message on TCP (no shared-memory lanes).
    Every process is killed before this returns.
    """
    if not callable(fn):
        raise TypeError(f"run_procs needs a function fn(comm, ...), got {type(fn).__name__}")
    n = checks.integer(n, "n", at_least=1, hint=" (the number of processes: a positive int)")
    trace = checks.boolean(trace, "trace")
    shared_memory = checks.boolean(shared_memory, "shared_memory")
    ctx = mp.get_context("spawn")
    up, downs = ctx.Queue(), [ctx.Queue() for _ in range(n)]
    procs = [ctx.Process(target=_rank_main, daemon=True, name=f"coursekit-rank-{r}",
                         args=(fn, r, up, downs[r], interface, timeout, trace, shared_memory,
                               args, kwargs))
             for r in range(n)]
    try:
        for p in procs:
            p.start()
        addresses = [None] * n
        for _, rank, address in _collect(up, procs, n, _START_TIMEOUT, "bind"):
            addresses[rank] = address
        key = secrets.token_bytes(32)  # over the private pipes, never a socket
        for down in downs:
            down.put((addresses, key))
        results = [None] * n
        for kind, rank, value in _collect(up, procs, n, timeout + 10.0, "finish", set(may_die)):
            if kind == "err":
                raise add_rank(value, rank, n)
            results[rank] = value
        return results
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
        for p in procs:
            p.join(5)
        for q in [up, *downs]:
            q.close()
            q.cancel_join_thread()


def _collect(up, procs, n, limit, phase, may_die=frozenset()):
    """Yield n messages from the ranks; CommError if one dies or ``limit`` seconds pass.

    A rank in ``may_die`` that died yields ("dead", rank, None) instead.
    """
    deadline = now() + limit
    seen = set()
    while len(seen) < n:
        try:
            item = up.get(timeout=0.2)
        except queue.Empty:
            dead = [r for r, p in enumerate(procs) if r not in seen and not p.is_alive()]
            for rank in [r for r in dead if r in may_die]:
                seen.add(rank)
                yield "dead", rank, None
            dead = [r for r in dead if r not in may_die]
            if dead:
                raise CommError(f"rank {dead[0]} died (exit code {procs[dead[0]].exitcode}) "
                                f"before it could {phase}") from None
            if now() > deadline:
                missing = sorted(set(range(n)) - seen)
                raise CommError(f"ranks {missing} did not {phase} within {limit:g} s") from None
            continue
        seen.add(item[1])
        yield item


def _rank_main(fn, rank, up, down, interface, timeout, trace, shared_memory, args, kwargs):
    from .zmq import bind
    endpoint = bind(interface)
    up.put(("addr", rank, endpoint.address))
    addresses, key = down.get(timeout=_START_TIMEOUT)
    comm = endpoint.connect(rank, addresses, key=key, timeout=timeout, trace=trace,
                            shared_memory=shared_memory)
    try:
        up.put(("ok", rank, fn(comm, *args, **kwargs)))
    except BaseException as exc:  # noqa: BLE001 - sent to the parent
        up.put(("err", rank, _portable(exc)))
    finally:
        comm.close()


def _portable(exc: BaseException) -> BaseException:
    """The exception itself if it survives pickling, else a CommError with its traceback."""
    import pickle
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:  # noqa: BLE001
        return CommError("".join(traceback.format_exception(exc)))
