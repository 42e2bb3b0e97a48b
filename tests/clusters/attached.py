"""Run the course's notebooks against a cluster they did not start, and prove it survived.

Each cluster kind the README offers (the MPI profile, a real Slurm, engines on two
hosts) gets one test that starts that cluster the way an instructor does, then:

1. takes a :func:`census` of its engines (engine id -> host and pid);
2. runs every chapter notebook and solution under nbval, in a fresh pytest process
   whose kernels attach with ``COURSEKIT_CLUSTER`` (:func:`run_notebooks`), exactly as
   a student's JupyterLab would on that cluster;
3. takes the census again: the same engines, the same processes. A notebook that
   killed, restarted or dropped an engine of a cluster it does not own fails here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "notebooks").glob("*.ipynb"))
SOLUTIONS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "solutions").glob("*.ipynb"))

#: The root conftest maps this onto COURSEKIT_CLUSTER (other runs start their own clusters).
ENV_TEST_CLUSTER = "COURSEKIT_TEST_CLUSTER"


CENSUS = """
import json, os, socket, sys
import ipyparallel as ipp
client = ipp.Client(sys.argv[1], timeout=30)
try:
    client.wait_for_engines(int(sys.argv[2]), timeout=float(sys.argv[3]), interactive=False)
    ids = sorted(client.ids)
    view = client.direct_view(targets=ids)  # os and socket functions pickle by name
    print(json.dumps(list(zip(ids, view.apply_sync(socket.gethostname), view.apply_sync(os.getpid)))))
finally:
    client.close()
"""


def census(client_file: str | Path, n: int, timeout: float = 120.0,
           prefix: tuple = ()) -> dict[int, tuple[str, int]]:
    """Engine id -> (host, pid) of the cluster described by ``client_file``, once at least
    ``n`` engines are registered; asked from a process started with ``prefix`` (e.g. in
    the network namespace that reaches the controller)."""
    done = subprocess.run([*prefix, sys.executable, "-c", CENSUS, str(client_file), str(n),
                           str(timeout)], capture_output=True, text=True, timeout=timeout + 60)
    if done.returncode != 0:
        raise RuntimeError(f"census of {client_file} failed: {done.stderr[-3000:]}")
    return {eid: (host, pid) for eid, host, pid in json.loads(done.stdout)}


def run_notebooks(client_file: str | Path, paths=None, *, env: dict | None = None,
                  prefix: tuple = (), timeout: float = 1500.0) -> subprocess.CompletedProcess:
    """nbval over ``paths`` (default: every notebook and solution) in a fresh pytest
    process (started with ``prefix``) whose kernels attach to ``client_file``; returns the
    finished process (``returncode``, combined ``stdout``)."""
    paths = list(paths or NOTEBOOKS + SOLUTIONS)
    environment = dict(os.environ, **(env or {}))
    environment[ENV_TEST_CLUSTER] = str(client_file)
    command = [*prefix, sys.executable, "-m", "pytest", *paths, "--nbval", "--nbval-current-env",
               "--nbval-sanitize-with", "tests/nbval_sanitize.cfg", "--nbval-cell-timeout=300",
               "-p", "no:cacheprovider", "-q", "-x"]
    return subprocess.run(command, cwd=ROOT, env=environment, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


def assert_notebooks_pass_and_cluster_survives(client_file, n: int, paths=None, *,
                                               prefix: tuple = (), **kw) -> str:
    """The whole check of one cluster kind; returns the nbval output (for the log)."""
    before = census(client_file, n, prefix=prefix)
    assert len(before) >= n, f"the cluster has {len(before)} engines, the notebooks need {n}"
    run = run_notebooks(client_file, paths, prefix=prefix, **kw)
    assert run.returncode == 0, f"nbval on the attached cluster failed:\n{run.stdout[-20000:]}"
    after = census(client_file, n, prefix=prefix)
    assert after == before, (f"the notebooks changed a cluster they do not own:\n"
                             f"before {before}\nafter  {after}")
    return run.stdout


def ipcluster(ipython_dir: str | Path, profile: str, *args: str, env: dict | None = None,
              timeout: float = 120.0) -> subprocess.CompletedProcess:
    """``ipcluster ARGS --profile=PROFILE`` with ``IPYTHONDIR`` set, as an instructor types it."""
    environment = dict(os.environ, IPYTHONDIR=str(ipython_dir), **(env or {}))
    environment.pop("COURSEKIT_CLUSTER", None)
    command = [str(Path(sys.executable).parent / "ipcluster"), *args, f"--profile={profile}"]
    return subprocess.run(command, env=environment, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=timeout)


def mpich_segments() -> set[str]:
    """The MPICH shared-memory files in /dev/shm (coursekit.comm.mpich_segments)."""
    from coursekit.comm.mpich_segments import SEGMENT_PREFIX
    folder = Path(SEGMENT_PREFIX).parent
    return {str(p) for p in folder.glob(Path(SEGMENT_PREFIX).name + "*")}


class DaemonCluster:
    """A cluster started by ``ipcluster start --daemonize`` in its own IPYTHONDIR; stopped by
    ``ipcluster stop``, then every process that inherited that IPYTHONDIR is ended.

    Leaving the ``with`` block without an error also checks that the stopped engines left no
    MPICH segment in /dev/shm (each MPI engine set left one per host before
    :mod:`coursekit.comm.mpich_segments`); any found is removed, then reported."""

    def __init__(self, ipython_dir: str | Path, profile: str, n: int, *, env=None,
                 timeout: float = 180.0):
        self.ipython_dir, self.profile, self.n = Path(ipython_dir), profile, n
        self.env, self.timeout = env, timeout

    @property
    def client_file(self) -> Path:
        return self.ipython_dir / f"profile_{self.profile}" / "security" / "ipcontroller-client.json"

    def __enter__(self) -> "DaemonCluster":
        self.segments_before = mpich_segments()
        started = ipcluster(self.ipython_dir, self.profile, "start", "--daemonize",
                            env=self.env, timeout=self.timeout)
        assert started.returncode == 0, started.stdout
        try:
            census(self.client_file_when_written(), self.n, timeout=self.timeout)
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        return self

    def client_file_when_written(self) -> Path:
        import time

        deadline = time.monotonic() + self.timeout
        while not self.client_file.is_file():
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.client_file} not written within {self.timeout} s; "
                                   f"logs: {self.logs()}")
            time.sleep(0.2)
        return self.client_file

    def logs(self) -> str:
        folder = self.ipython_dir / f"profile_{self.profile}" / "log"
        return "\n".join(f"== {p.name}\n{p.read_text()[-3000:]}" for p in sorted(folder.glob("*")))

    def __exit__(self, *exc) -> None:
        from coursekit.cluster.processes import end_cluster_processes

        ipcluster(self.ipython_dir, self.profile, "stop", env=self.env, timeout=120)
        end_cluster_processes(str(self.ipython_dir))
        left = sorted(mpich_segments() - self.segments_before)
        for path in left:
            Path(path).unlink(missing_ok=True)
        if not any(exc):
            assert not left, f"the stopped engines left MPICH segments in /dev/shm: {left}"
