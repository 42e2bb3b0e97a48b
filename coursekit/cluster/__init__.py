"""Start, attach to, and stop the ipyparallel cluster a chapter runs on.

A student's notebook calls ``start(n=4)``: a controller on loopback and ``n``
local engines, ready in about two seconds (the controller's heartbeat period is
lowered from 3 s to 100 ms; with the default it takes ~6.7 s here; the number of missed
beats after which it drops an engine is raised to match, so an engine still has
:data:`HEART_FAILURE_S` to answer, as with ipyparallel's defaults). An
instructor sets one environment variable, ``COURSEKIT_CLUSTER``, and the same
``start()`` call attaches to the running cluster instead (see :func:`connect`).

A local cluster's processes are started by its reaper, a watchdog process that ends
them, and every process they start, when the kernel dies without stopping the
cluster, even by SIGKILL (see :mod:`coursekit.cluster.reaper`).

Every engine learns its ``rank`` (0 .. size-1, the MPI rank when the engines
are MPI processes, else each host's engines in a block of consecutive ranks, in engine-id
order: :func:`ranks_in_blocks_by_host`) and ``size``; on the engine,
:func:`this_engine` returns them and the names ``rank`` and ``size`` are set in
its namespace for ``%px`` cells.

Engines run one compute thread each by default (``NUMBA_NUM_THREADS=1``,
``OMP_NUM_THREADS=1`` ...): with several engines per machine, more threads only
oversubscribe the cores and make timings noisy.
"""

from __future__ import annotations

import math
import os
import re
import signal
import socket
import sys
from dataclasses import dataclass
from pathlib import Path

from coursekit import checks

__all__ = [
    "ENV_CLUSTER",
    "ClusterError",
    "CourseCluster",
    "EngineError",
    "EngineInfo",
    "connect",
    "start",
    "this_engine",
]

#: Set to ``PROFILE``, ``PROFILE:CLUSTER_ID`` or the path of an
#: ``ipcontroller-client.json`` file to make :func:`start` attach to that
#: running cluster instead of starting a local one.
ENV_CLUSTER = "COURSEKIT_CLUSTER"

#: Environment variables that limit every engine to ``threads`` compute threads.
THREAD_VARIABLES = (
    "NUMBA_NUM_THREADS",
    "OMP_NUM_THREADS",
    "OPENBLAS_NUM_THREADS",
    "MKL_NUM_THREADS",
)

ENGINE_LAUNCHERS = ("local", "mpi")


class ClusterError(RuntimeError):
    """The cluster could not be started, found or reached."""


class EngineError(RuntimeError):
    """Code run on an engine raised; the message names the engine's rank."""


def error_ranks(error) -> list:
    """(ename, evalue, engine_info) of every engine in an ipyparallel RemoteError or
    CompositeError."""
    failures = getattr(error, "elist", None) or [
        (error.ename, error.evalue, error.traceback, error.engine_info)]
    return [(ename, evalue, info) for ename, evalue, _tb, info in failures]


_ENGINE_DIED = re.compile(r"Engine (\d+) died")


def failure_lines(error, engine_ids) -> list[str]:
    """One line per distinct error of an ipyparallel remote error, naming the ranks that
    raised it: "ranks 0-3: Diverged: ..." rather than the same line once per rank."""
    ranks_of: dict[str, list] = {}
    for ename, evalue, info in error_ranks(error):
        engine_id = (info or {}).get("engine_id")
        text = f"{ename}: {evalue}".rstrip(": ")
        died = _ENGINE_DIED.match(str(evalue)) if ename == "EngineError" else None
        if died:  # ipyparallel names the engine id, which need not be the rank
            engine_id = int(died.group(1))
            text = ("its engine process died while running the task (killed by a signal, "
                    "out of memory, or a crash in native code)")
        rank = engine_ids.index(engine_id) if engine_id in engine_ids else None
        ranks_of.setdefault(text, []).append(rank)
    return [f"{_rank_names(ranks)}{text}" for text, ranks in ranks_of.items()]


def _rank_names(ranks: list) -> str:
    known = sorted(r for r in ranks if r is not None)
    if not known:
        return ""
    if len(known) == 1:
        return f"rank {known[0]}: "
    if known == list(range(known[0], known[-1] + 1)):
        return f"ranks {known[0]}-{known[-1]}: "
    return f"ranks {', '.join(map(str, known))}: "


@dataclass(frozen=True)
class EngineInfo:
    """What an engine knows about itself."""

    rank: int
    size: int
    mpi: bool
    host: str
    pid: int
    local_rank: int  # rank among the engines on this host: picks this engine's GPU
    local_size: int


_this_engine: EngineInfo | None = None


def this_engine() -> EngineInfo:
    """Rank and size of the engine this code runs on (only valid on an engine)."""
    if _this_engine is None:
        raise RuntimeError(
            "this_engine() only works on an engine of a coursekit cluster: "
            "call it inside a function run with cluster.run(...) or a %px cell"
        )
    return _this_engine


def _register_engine(rank: int, size: int, mpi: bool, local_rank: int, local_size: int) -> EngineInfo:
    """Runs on each engine once: store its rank and size (module + namespace)."""
    global _this_engine
    _this_engine = EngineInfo(
        rank, size, mpi, socket.gethostname(), os.getpid(), local_rank, local_size
    )
    try:  # make `rank` and `size` available to %px cells
        from IPython import get_ipython

        shell = get_ipython()
        if shell is not None:
            shell.user_ns.update(rank=rank, size=size)
    except ImportError:
        pass
    return _this_engine


#: Set by MPI launchers (MPICH/Hydra and Intel MPI, Open MPI, PMIx) in every process they start.
MPI_LAUNCHER_VARIABLES = ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK")


def _probe_engine() -> tuple[int | None, str]:
    """Runs on each engine: (its MPI rank if it is one of several MPI processes, its host).

    mpi4py is imported only in processes an MPI launcher started: initializing MPI in
    every plain engine would cost time and, on some systems, hang.
    """
    host = socket.gethostname()
    if not any(name in os.environ for name in MPI_LAUNCHER_VARIABLES):
        return None, host
    try:
        from mpi4py import MPI
    except ImportError:
        return None, host
    from coursekit.comm.mpich_segments import forget_bootstrap_segments
    forget_bootstrap_segments()  # the engine ends by a signal: MPI_Finalize never removes it
    world = MPI.COMM_WORLD
    return (world.Get_rank() if world.Get_size() > 1 else None), host


def ranks_in_blocks_by_host(engine_ids: list[int], hosts: list[str]) -> list[int]:
    """Engine ids in rank order: each host's engines get consecutive ranks (block placement,
    as Slurm and torchrun number them: rank = node_rank * local_size + local_rank).

    Engines of several hosts register in whatever order their hosts start them; numbered by
    engine id, hosts A and B could become ranks A B A B, and a ring over p ranks on m hosts
    would cross hosts on all p links instead of m. Hosts keep the order of their first
    engine, and a host's engines the order of their ids.
    """
    first_seen = {host: i for i, host in reversed(list(enumerate(hosts)))}
    order = sorted(range(len(engine_ids)), key=lambda i: (first_seen[hosts[i]], engine_ids[i]))
    return [engine_ids[i] for i in order]


HEART_FAILURE_S = 30.0
"""Seconds an engine may go without answering the controller's heartbeat before the
controller drops it as dead: ipyparallel's own (10 missed beats of 3 s). A process that
exits is reported at once by its nanny; the heartbeat is for an engine that hangs or a host
that vanishes. With 100 ms beats and ipyparallel's 10 misses the limit was 1 s, and an engine
stalled that long on a loaded machine (a laptop swapping, CI's 2 CPUs) was dropped for good."""


def heart_misses(heartbeat_ms: int) -> int:
    """Missed beats of ``heartbeat_ms`` the controller allows: HEART_FAILURE_S of them, and
    never fewer than ipyparallel's 10."""
    return max(10, math.ceil(HEART_FAILURE_S * 1000 / heartbeat_ms))


INTERRUPT_GRACE_S = 10.0
"""Seconds interrupted engines get to return before the KeyboardInterrupt goes on."""


class CourseCluster:
    """A connected cluster: run functions on every engine, in rank order, then stop.

    Use as a context manager (``with start(4) as c: ...``) or call :meth:`stop`.
    A cluster this process started is shut down by :meth:`stop`; an attached
    cluster (an instructor's) is only disconnected from.
    """

    def __init__(self, client, ipp_cluster=None, *, timeout: float = 60.0,
                 size: int | None = None):
        self.client = client
        self.ipp_cluster = ipp_cluster
        self.timeout = timeout
        self._stopped = False
        # started the cluster's processes; ends them if this process dies without stopping it
        self._reaper = getattr(ipp_cluster, "reaper", None)  # (coursekit.cluster.reaper)
        self.engine_ids, self.mpi, hosts = self._assign_ranks()
        if size is not None:  # the first `size` ranks; the other engines stay untouched
            self.engine_ids, hosts = self.engine_ids[:size], hosts[:size]
        self.size = len(self.engine_ids)
        self.view = client.direct_view(targets=self.engine_ids)
        self.view.block = False
        for rank, engine_id in enumerate(self.engine_ids):
            same_host = [r for r, h in enumerate(hosts) if h == hosts[rank]]
            client[engine_id].apply_sync(
                _register_engine, rank, self.size, self.mpi, same_host.index(rank), len(same_host)
            )

    @property
    def owned(self) -> bool:
        """True if this process started the cluster (and :meth:`stop` ends it)."""
        return self.ipp_cluster is not None

    def _assign_ranks(self) -> tuple[list[int], bool, list[str]]:
        """Engine ids in rank order (MPI rank order for MPI engines, else blocks by host),
        and their hosts."""
        ids = sorted(self.client.ids)
        mpi_ranks, hosts = zip(*self.client.direct_view(targets=ids).apply_sync(_probe_engine))
        host_of = dict(zip(ids, hosts))
        mpi = all(r is not None for r in mpi_ranks) and sorted(mpi_ranks) == list(range(len(ids)))
        if mpi:
            ids = [eid for _, eid in sorted(zip(mpi_ranks, ids))]
        else:
            ids = ranks_in_blocks_by_host(ids, hosts)
        return list(ids), mpi, [host_of[eid] for eid in ids]

    def run(self, fn, *args, timeout: float | None = None, **kwargs) -> list:
        """Run ``fn(*args, **kwargs)`` on every engine; return the results in rank order.

        Raises :class:`EngineError` naming the rank if an engine raised, and
        ``TimeoutError`` naming the ranks still busy after ``timeout`` seconds. A
        KeyboardInterrupt here (the notebook's stop button) interrupts the engines too,
        on a cluster this process started, so the next cell finds them free.
        """
        import ipyparallel as ipp

        timeout = self.timeout if timeout is None else timeout
        result = self.view.apply_async(fn, *args, **kwargs)
        try:
            return result.get(timeout=timeout)
        except KeyboardInterrupt:
            self._interrupt_and_wait(result)
            raise
        except ipp.error.TimeoutError:
            busy = [self.engine_ids.index(e) for e in result._targets if not result.ready()]
            raise TimeoutError(
                f"{getattr(fn, '__name__', fn)} did not finish within {timeout} s on ranks "
                f"{busy}; interrupt them with cluster.interrupt() or raise timeout=..."
            ) from None
        except ipp.error.CompositeError as error:
            raise self._engine_error(fn, error) from None
        except ipp.error.RemoteError as error:
            raise self._engine_error(fn, error) from None

    def _engine_error(self, fn, error) -> EngineError:
        lines = failure_lines(error, self.engine_ids)
        name = getattr(fn, "__name__", repr(fn))
        return EngineError(f"{name} failed on {len(error_ranks(error))} engine(s):\n  "
                           + "\n  ".join(lines))

    def _interrupt_and_wait(self, result) -> None:
        """Interrupt the engines still running ``result`` (a cluster we started; an attached
        cluster's engines cannot be signalled and finish on their own) and give them
        INTERRUPT_GRACE_S seconds to return."""
        if self.owned and not result.ready():
            self.interrupt()
            result.wait(INTERRUPT_GRACE_S)

    def interrupt(self) -> None:
        """Send SIGINT to busy engines of a cluster this process started."""
        if self.owned:
            self.ipp_cluster.signal_engines_sync(signal.SIGINT)

    def stop(self) -> None:
        """Interrupt busy engines, shut down a cluster we started, close the client."""
        if self._stopped:
            return
        self._stopped = True
        if self.owned:
            try:
                self.ipp_cluster.signal_engines_sync(signal.SIGINT)
            except Exception:  # engines that already died cannot be signalled
                pass
            self.client.close()
            try:
                self.ipp_cluster.stop_cluster_sync()
            finally:  # ends what the engines started (and anything ipyparallel left) and exits
                if self._reaper is not None:
                    self._reaper.close()
        else:
            self.client.close()

    def __enter__(self) -> "CourseCluster":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def __repr__(self) -> str:
        how = "started here" if self.owned else "attached"
        state = "stopped" if self._stopped else f"{self.size} engines"
        return f"<CourseCluster {state}, {how}, mpi={self.mpi}>"


def _engine_environment(threads: int, env: dict | None) -> dict:
    environment = {name: str(threads) for name in THREAD_VARIABLES}
    environment.update({str(k): str(v) for k, v in (env or {}).items()})
    return environment


def start(
    n: int = 4,
    *,
    engines: str = "local",
    threads_per_engine: int = 1,
    engine_env: dict | None = None,
    ip: str = "127.0.0.1",
    heartbeat_ms: int = 100,
    timeout: float = 60.0,
    profile: str | None = None,
    local: bool = False,
) -> CourseCluster:
    """Start a local cluster of ``n`` engines and connect to it.

    If the environment variable ``COURSEKIT_CLUSTER`` is set, attach to that
    running cluster instead, so notebooks run unchanged on an instructor's
    cluster: wait until it has ``n`` engines and use ranks 0 .. n-1 of them, so
    the lesson has the same shape (and the same outputs) as on a laptop.
    ``local=True`` starts local engines even then: for a section that needs engines of
    its own kind on the kernel's machine (chapter 09's MPI ranks), whatever the chapter's
    cluster is.

    ``engines="mpi"`` starts the engines with ``mpiexec`` from this Python's
    environment (``pip install "coursekit[mpi]"``), so they are MPI ranks.
    Engines that are not up within ``timeout`` seconds raise
    :class:`ClusterError` with the engines' own output.
    """
    checks.integer(n, "n", at_least=1, hint=" (the number of engines)")
    checks.integer(threads_per_engine, "threads_per_engine", at_least=1,
                   hint=" (compute threads per engine)")
    if engines not in ENGINE_LAUNCHERS:
        raise ValueError(f"engines must be one of {ENGINE_LAUNCHERS}, got {engines!r}")
    if engine_env is not None and not (isinstance(engine_env, dict) and all(
            isinstance(k, str) and isinstance(v, (str, int, float)) and not isinstance(v, bool)
            for k, v in engine_env.items())):
        raise TypeError(f"engine_env must be a dict of environment variables (str names to "
                        f"str or number values) or None; got {type(engine_env).__name__} "
                        f"{engine_env!r:.60}")
    checks.boolean(local, "local")
    if os.environ.get(ENV_CLUSTER) and not local:
        return connect(n=n, size=n, timeout=timeout)
    if profile is not None:
        _profile_dir(profile)  # a clear error if it does not exist

    import ipyparallel as ipp

    # imported here, not with the package: `python -m coursekit.cluster.reaper` runs it as
    # __main__, and runpy warns when the package has imported it already
    from coursekit.cluster import launchers
    from coursekit.cluster.reaper import start_reaper

    launcher_args = {}
    if engines == "mpi":
        launcher_args["mpi_cmd"] = [_mpiexec()]
    # the reaper starts the controller and the engines, and ends them (and all they start)
    # if this process dies without stopping the cluster: see coursekit.cluster.reaper
    ipp_cluster = launchers.ReapedCluster(
        reaper=start_reaper(),
        n=n,
        profile=profile or "default",
        controller_ip=ip,
        controller_args=[f"--HeartMonitor.period={heartbeat_ms}",
                         f"--HeartMonitor.max_heartmonitor_misses={heart_misses(heartbeat_ms)}"],
        controller_launcher_class=launchers.ReapedController,
        engine_launcher_class=launchers.ENGINE_LAUNCHERS[engines],
        engine_timeout=int(timeout),
        log_level=40,  # errors only: launcher chatter would end up in notebook outputs
    )
    try:
        ipp_cluster.start_controller_sync()
        ipp_cluster.start_engines_sync(
            n, environment=_engine_environment(threads_per_engine, engine_env), **launcher_args
        )
        client = ipp_cluster.connect_client_sync()
        try:
            client.wait_for_engines(n, timeout=timeout, interactive=False)
        except (TimeoutError, ipp.error.EngineError) as error:  # EngineError: engines ended
            output = "\n".join(es.get_output() for es in ipp_cluster.engines.values())
            client.close()
            when = (f"within {timeout} s" if isinstance(error, TimeoutError)
                    else "before the engines ended")
            raise ClusterError(
                f"only {len(client.ids)} of {n} engines registered {when}. "
                f"Engine output:\n{output or '(no output)'}"
            ) from None
        return CourseCluster(client, ipp_cluster, timeout=timeout)
    except BaseException:
        try:
            ipp_cluster.stop_cluster_sync()
        finally:
            ipp_cluster.reaper.close()
        raise


def connect(
    spec: str | None = None,
    *,
    profile: str | None = None,
    cluster_id: str | None = None,
    n: int = 1,
    size: int | None = None,
    timeout: float = 60.0,
) -> CourseCluster:
    """Attach to a running cluster.

    ``spec`` (default: ``$COURSEKIT_CLUSTER``) is ``PROFILE``,
    ``PROFILE:CLUSTER_ID`` or the path of an ``ipcontroller-client.json``;
    ``profile`` / ``cluster_id`` may be given instead. Waits until at least
    ``n`` engines are registered, then uses the first ``size`` of them in rank
    order (default: all).
    """
    import ipyparallel as ipp

    checks.integer(n, "n", at_least=1, hint=" (the minimum number of engines to wait for)")
    if size is not None:
        checks.integer(size, "size", at_least=1, hint=" (the number of engines to use)")
        if size > n:
            raise ValueError(f"size={size} engines cannot be used when waiting for only n={n}")
    spec = spec if spec is not None else os.environ.get(ENV_CLUSTER, "")
    url_file = None
    if spec.endswith(".json"):
        url_file = Path(spec).expanduser()
        if not url_file.is_file():
            raise ClusterError(f"{ENV_CLUSTER}/spec names {url_file}, which does not exist")
    elif spec:
        profile, _, cluster_id = spec.partition(":")
    profile = profile or "default"
    if url_file is None:
        url_file = _connection_file(profile, cluster_id or "")
    try:
        client = ipp.Client(str(url_file), timeout=min(timeout, 10))
    except (TimeoutError, ipp.error.TimeoutError) as error:
        raise ClusterError(
            f"the controller of {url_file} does not answer ({error}); is the cluster running? "
            "Start it with `ipcluster start` (see README, Instructors)"
        ) from None
    try:
        client.wait_for_engines(n, timeout=timeout, interactive=False)
    except TimeoutError:
        count = len(client.ids)
        client.close()
        raise ClusterError(
            f"the cluster of {url_file} has {count} engines; waited {timeout} s for {n}"
        ) from None
    return CourseCluster(client, timeout=timeout, size=size)


def _ipython_dir() -> Path:
    from IPython.paths import get_ipython_dir

    return Path(get_ipython_dir())


def _profile_dir(profile: str) -> Path:
    if not isinstance(profile, str) or not profile:
        raise TypeError(f"profile must be an IPython profile name (a non-empty str) or None; "
                        f"got {type(profile).__name__} {profile!r:.60}")
    path = _ipython_dir() / f"profile_{profile}"
    if not path.is_dir():
        raise ClusterError(
            f"no IPython profile {profile!r} (looked for {path}). Create it with "
            f"`ipython profile create --parallel {profile}` or fix the name "
            f"(also check ${ENV_CLUSTER})"
        )
    return path


def _connection_file(profile: str, cluster_id: str) -> Path:
    security = _profile_dir(profile) / "security"
    name = f"ipcontroller-{cluster_id}-client.json" if cluster_id else "ipcontroller-client.json"
    path = security / name
    if not path.is_file():
        running = sorted(p.name for p in security.glob("ipcontroller-*client.json"))
        raise ClusterError(
            f"no running cluster with id {cluster_id!r} in profile {profile!r} "
            f"(no {path}); running there: {running or 'none'}. Start one with "
            f"`ipcluster start --profile={profile}` or fix the id"
        )
    return path


def _mpiexec() -> str:
    candidate = Path(sys.prefix) / "bin" / "mpiexec"
    if candidate.exists():
        return str(candidate)
    raise ClusterError(
        f"engines='mpi' needs mpiexec in this environment ({candidate} is missing): "
        'pip install "coursekit[mpi]"'
    )

