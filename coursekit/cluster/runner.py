"""Where a chapter's SPMD work runs: ranks in this process, or the engines of a cluster.

Every chapter's experiment takes a *runner* and starts its work the same way::

    from coursekit.cluster.runner import LocalRunner, ClusterRunner
    runner = LocalRunner(4)                  # 4 ThreadComm ranks in this process
    runner = ClusterRunner(cluster)          # the engines of a cluster (after setup_comm)
    results = runner.run(fn, x, y, ranks=2, on_update=redraw)

``fn(comm, *args, **kwargs)`` runs on the first ``ranks`` ranks (default: all of them) with
a Comm of exactly those ranks; ``run`` returns their results in rank order. What the ranks
publish with :mod:`coursekit.cluster.live` reaches ``on_update(data)`` (one dict per rank) while the
run goes on. :meth:`Runner.start` returns the running :class:`Run` instead, for a notebook
that wants to do something else meanwhile.

A run that fails raises :class:`RankFailure`, whichever the runner: it names the rank(s)
whose error stopped the run (not the ones that only timed out waiting for them), with
each rank's error type and message; in this process the first rank's own exception is
also its ``__cause__``. A KeyboardInterrupt (the notebook's stop button) or a timeout
stops the ranks (the engines of a cluster this process started are interrupted).
"""

from __future__ import annotations

import threading
import time

from coursekit import checks
from coursekit.cluster import live

__all__ = ["ClusterRunner", "LocalRunner", "RankFailure", "Run", "Runner"]

#: Errors a rank raises only because another rank stopped answering.
KNOCK_ON_ERRORS = ("CommTimeout", "PeerGone", "CommError")


class RankFailure(RuntimeError):
    """Work failed on one or more ranks.

    ``ranks``: the ranks whose own error stopped the run (knock-on timeouts of the ranks
    that waited for them are listed in the message, not here); ``errors``: rank -> (error
    type name, message) for every rank that raised; ``ename``: the first cause's type name.
    """

    def __init__(self, what: str, errors: dict):
        causes = [r for r, (ename, _) in sorted(errors.items()) if ename not in KNOCK_ON_ERRORS]
        self.ranks = causes or sorted(errors)
        self.errors = dict(sorted(errors.items()))
        self.ename = self.errors[self.ranks[0]][0] if self.errors else ""
        who = ", ".join(f"rank {r}" for r in self.ranks) or "(no rank)"
        lines = [f"rank {r}: {ename}: {str(evalue).removeprefix(f'rank {r}: ')}".rstrip(": ")
                 for r, (ename, evalue) in self.errors.items()]
        super().__init__(f"{what} failed on {who}:\n  " + "\n  ".join(lines))


class Run:
    """A run in progress: ``data`` (one dict per rank, what the ranks published so far),
    ``ready()``, ``wait(timeout)`` and ``get(timeout)`` (the results in rank order, or
    :class:`RankFailure`). ``stop()`` interrupts the ranks."""

    data: list

    def ready(self) -> bool:
        raise NotImplementedError

    def wait(self, timeout: float | None = None) -> bool:
        raise NotImplementedError

    def get(self, timeout: float | None = None) -> list:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class Runner:
    """Starts ``fn(comm, *args, **kwargs)`` on the first k of its ``size`` ranks."""

    size: int
    #: seconds :meth:`run` waits for a run when the caller gives no ``timeout``
    timeout: float | None

    def check_ranks(self, ranks) -> int:
        """``ranks`` checked against this runner (None: all of its ranks)."""
        if ranks is None:
            return self.size
        return checks.integer(ranks, "ranks", at_least=1, at_most=self.size,
                              hint=f" ({self.describe()} has {self.size})")

    def check_workers(self, workers) -> int:
        """An experiment's ``workers=``: how many of this runner's ranks it runs on (None:
        all of them); TypeError unless an int, ValueError unless 1 <= workers <= size."""
        if workers is None:
            return self.size
        n = checks.integer(workers, "workers", at_least=1, hint=" (the number of workers)")
        if n > self.size:
            raise ValueError(f"workers={n} but {self.describe()} has {self.size} ranks")
        return n

    def describe(self) -> str:
        raise NotImplementedError

    def start(self, fn, *args, ranks: int | None = None, may_die=(), **kwargs) -> Run:
        """Start ``fn`` on the first ``ranks`` ranks and return the :class:`Run`.

        ``may_die``: ranks whose *process* may end during the run (a fault the experiment
        injects on purpose): their result is None instead of a failure of the run.
        """
        raise NotImplementedError

    def reset_comms(self) -> None:
        """Rebuild the ranks' comms, dropping messages in flight (after a run that lost a
        rank whose process lives on). Each run of a LocalRunner has fresh comms anyway."""

    def run(self, fn, *args, ranks: int | None = None, on_update=None, progress: bool = False,
            interval: float = 0.1, timeout: float | None = None, may_die=(), **kwargs) -> list:
        """Run ``fn`` to the end (see the module docstring); the results in rank order.

        ``on_update(data)`` / ``progress``: follow the run live (:func:`coursekit.cluster.live.follow`);
        ``timeout``: seconds for the whole run (default: the runner's ``timeout``).
        """
        if not callable(fn):
            raise TypeError(f"a runner runs a function fn(comm, ...), got {type(fn).__name__}")
        checks.callback(on_update, "on_update", "(data), called with one dict per rank,")
        checks.boolean(progress, "progress")
        checks.real(interval, "interval", above=0, hint=" (seconds between updates)")
        if timeout is not None:
            checks.real(timeout, "timeout", above=0, hint=" (seconds) or None")
        run = self.start(fn, *args, ranks=ranks, may_die=may_die, **kwargs)
        try:
            return live.follow(run, on_update, progress=progress, interval=interval,
                               timeout=self.timeout if timeout is None else timeout)
        except (KeyboardInterrupt, TimeoutError):
            run.stop()
            raise


class _LocalRun(Run):
    """``fn`` on k ThreadComm ranks on a background thread."""

    def __init__(self, fn, k: int, args, kwargs, comm_timeout: float, name: str):
        from coursekit.comm import run_local

        self.data = [{} for _ in range(k)]
        self._result = self._error = None
        failed: dict = {}  # id(exception) -> rank

        def rank_body(comm, *a, **kw):
            live.attach_sink(self.data[comm.rank].update)
            try:
                return fn(comm, *a, **kw)
            except BaseException as exc:
                failed[id(exc)] = comm.rank
                raise
            finally:
                live.attach_sink(None)

        def main():
            try:
                self._result = run_local(rank_body, k, *args, timeout=comm_timeout, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - raised by get() as a RankFailure
                rank = failed.get(id(exc))
                if rank is None or isinstance(exc, KeyboardInterrupt):
                    self._error = exc
                else:
                    message = str(exc).removeprefix(f"[rank {rank} of {k}] ")
                    self._error = RankFailure(name, {rank: (type(exc).__name__, message)})
                    self._error.__cause__ = exc

        self._thread = threading.Thread(target=main, name="coursekit-local-run", daemon=True)
        self._thread.start()

    def ready(self) -> bool:
        return not self._thread.is_alive()

    def wait(self, timeout: float | None = None) -> bool:
        self._thread.join(timeout)
        return self.ready()

    def get(self, timeout: float | None = None) -> list:
        if not self.wait(timeout):
            raise TimeoutError(f"the local run did not finish within {timeout} s")
        if self._error is not None:
            raise self._error
        return self._result

    def stop(self) -> None:
        """The ranks stop at their next comm call or at their comm timeout."""


class LocalRunner(Runner):
    """``size`` ThreadComm ranks in this process (tests, exercises, quick demos).

    ``comm_timeout``: seconds a rank waits for a message before it gives up;
    ``timeout``: default seconds for a whole run (None: no limit beyond the comms').
    """

    def __init__(self, size: int, *, comm_timeout: float = 30.0, timeout: float | None = None):
        self.size = checks.integer(size, "size", at_least=1)
        self.comm_timeout = checks.real(comm_timeout, "comm_timeout", above=0)
        self.timeout = None if timeout is None else checks.real(timeout, "timeout", above=0)

    def describe(self) -> str:
        return f"LocalRunner({self.size})"

    def start(self, fn, *args, ranks: int | None = None, may_die=(), **kwargs) -> Run:
        k = self.check_ranks(ranks)
        return _LocalRun(fn, k, args, kwargs, self.comm_timeout, _name(fn))

    def __repr__(self) -> str:
        return f"<LocalRunner: {self.size} ThreadComm ranks>"


def _on_rank(fn, k: int, args, kwargs):
    """Engine side: the first k engines run ``fn`` on a Comm of k ranks; the others None."""
    from coursekit.comm import engine_comm, first_ranks

    comm = first_ranks(engine_comm(), k)
    return None if comm is None else fn(comm, *args, **kwargs)


class _EngineRun(Run):
    """One AsyncResult per engine, seen as one run: a rank whose process died (allowed by
    ``may_die``) yields None instead of failing the others' results."""

    def __init__(self, cluster, fn, k: int, args, kwargs, may_die, name: str):
        self.cluster, self.k, self.name = cluster, k, name
        self.may_die = frozenset(may_die)
        self.results = [cluster.client[eid].apply_async(_on_rank, fn, k, args, kwargs)
                        for eid in cluster.engine_ids[:k]]

    @property
    def data(self) -> list[dict]:
        return [ar.data for ar in self.results]

    def ready(self) -> bool:
        return all(ar.ready() for ar in self.results)

    def wait(self, timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        for ar in self.results:
            ar.wait(None if deadline is None else max(deadline - time.monotonic(), 0))
        return self.ready()

    def wait_for_output(self, timeout: float) -> None:
        for ar in self.results:
            ar.wait_for_output(timeout)

    def get(self, timeout: float | None = None) -> list:
        import ipyparallel as ipp

        if not self.wait(timeout):
            busy = [r for r, ar in enumerate(self.results) if not ar.ready()]
            raise TimeoutError(f"{self.name} did not finish within {timeout} s on ranks {busy}")
        outputs, errors = [], {}
        for rank, ar in enumerate(self.results):
            try:
                outputs.append(ar.get())
            except ipp.error.RemoteError as err:
                if err.ename == "EngineError" and rank in self.may_die:
                    outputs.append(None)  # its process died, as the experiment asked
                    continue
                errors[rank] = (err.ename, _engine_message(err))
                outputs.append(None)
        if errors:
            raise RankFailure(self.name, errors)
        return outputs

    def stop(self) -> None:
        self.cluster.interrupt()


def _engine_message(err) -> str:
    if err.ename == "EngineError" and "died" in str(err.evalue):
        return ("its engine process died while running the task (killed by a signal, out of "
                "memory, or a crash in native code)")
    return str(err.evalue)


class ClusterRunner(Runner):
    """The engines of ``cluster`` (a :class:`~coursekit.cluster.CourseCluster`, after
    ``coursekit.comm.setup_comm(cluster)``); rank r is engine ``cluster.engine_ids[r]``.

    ``timeout``: default seconds for a whole run. Engines beyond a run's ``ranks`` stay idle.
    """

    def __init__(self, cluster, *, timeout: float = 300.0):
        self.cluster = checks.cluster(cluster)
        self.timeout = checks.real(timeout, "timeout", above=0)

    @property
    def size(self) -> int:
        return self.cluster.size

    @property
    def owned(self) -> bool:
        """True if this process started the cluster (faults that end engines are allowed)."""
        return self.cluster.owned

    def describe(self) -> str:
        return "the cluster"

    def reset_comms(self) -> None:
        from coursekit.comm import reset_comm
        reset_comm(self.cluster)

    def start(self, fn, *args, ranks: int | None = None, may_die=(), **kwargs) -> Run:
        k = self.check_ranks(ranks)
        return _EngineRun(self.cluster, fn, k, args, kwargs, may_die, _name(fn))

    def __repr__(self) -> str:
        return f"<ClusterRunner: {self.size} engines>"


def _name(fn) -> str:
    return getattr(fn, "__name__", type(fn).__name__)
