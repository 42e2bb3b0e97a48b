"""A class on Slurm through JupyterHub: two students log in, each gets a JupyterLab server
that is a Slurm job, runs chapter 00 in it, and the engines that ``cluster.start`` gives
them live inside that job. Stopping the servers ends the jobs and every student process.

Real components only: the hub from ``profiles/jupyterhub/jupyterhub_config.py`` (batchspawner's
SlurmSpawner, ``sudo -E -u STUDENT sbatch``), configurable-http-proxy from npm, a private
Slurm (:class:`slurm.SlurmCluster`), two throwaway Unix accounts. Everything listens on
127.0.0.1. Needs root (accounts, sudo, Slurm daemons).
"""

from __future__ import annotations

import ast
import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest

from attached import ROOT
from hub_client import Student
from slurm import SlurmCluster, free_port
from coursekit.cluster.processes import end_processes, with_descendants

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(1800)]

CONFIG = ROOT / "profiles" / "jupyterhub" / "jupyterhub_config.py"
#: The class's environment (``make test-clusters`` builds it): hub, proxy, students' servers.
VENV = Path(os.environ.get("COURSEKIT_TEST_CLASS_VENV", sys.prefix))
PROXY = VENV / "proxy" / "node_modules" / ".bin" / "configurable-http-proxy"
#: Run after the notebook, in the same kernel: where the kernel and a fresh cluster's
#: engines run (Slurm job id and host).
WHERE = """
import json, os, socket
from coursekit import cluster
def _where():
    import os, socket
    return os.environ.get("SLURM_JOB_ID"), socket.gethostname()
_c = cluster.start(n=2)
_engines = _c.run(_where)
_c.stop()
json.dumps({"kernel": _where(), "engines": _engines})
"""


def processes_of(user: str) -> list[psutil.Process]:
    return [p for p in psutil.process_iter(["username"]) if p.info["username"] == user]


@contextmanager
def unix_accounts(count: int):
    """Throwaway accounts with home folders; removed with every process they own."""
    names = [f"ckstu{os.getpid() % 100000}{i}" for i in range(count)]
    made = []
    try:
        for name in names:
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/bash", name],
                           check=True, capture_output=True, timeout=30)
            made.append(name)
        yield names
    finally:
        for name in made:
            end_processes(processes_of(name))
            subprocess.run(["userdel", "--remove", name], capture_output=True, timeout=30)


@contextmanager
def running_hub(state: Path, students: list[str], password: str, slurm_env: dict):
    """The course's hub config, plus only what a test must change: dummy passwords,
    private ports, the proxy from npm in the class's environment, everything on 127.0.0.1,
    and the private Slurm's variables (``SLURM_CONF``...) for sbatch and the jobs."""
    state.mkdir(mode=0o700)  # the hub's database and cookie secret: not for students
    (state / "students").write_text("\n".join(students) + "\n")
    port = free_port()
    (state / "test_config.py").write_text(f"""
c = get_config()
load_subconfig({str(CONFIG)!r})
c.JupyterHub.authenticator_class = "dummy"
c.DummyAuthenticator.password = {password!r}
c.JupyterHub.hub_port = {free_port()}
c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{free_port()}"
c.ConfigurableHTTPProxy.command = [{str(PROXY)!r}]
c.Spawner.environment.update({slurm_env!r})
# the private Slurm's node name (ck1) is an alias of 127.0.0.1 that no DNS knows
c.SlurmSpawner.state_exechost_exp = "127.0.0.1"
""")
    environment = dict(os.environ, **slurm_env, **job_size(slurm_env, len(students)),
                       COURSEKIT_HUB_CLASS_LIST=str(state / "students"),
                       COURSEKIT_HUB_STATE=str(state), COURSEKIT_HUB_VENV=str(VENV),
                       COURSEKIT_HUB_IP="127.0.0.1", COURSEKIT_HUB_PORT=str(port),
                       COURSEKIT_HUB_API_IP="127.0.0.1", COURSEKIT_HUB_SERVER_IP="127.0.0.1")
    log = open(state / "jupyterhub.log", "w")
    hub = subprocess.Popen([str(VENV / "bin" / "jupyterhub"), "-f", str(state / "test_config.py")],
                           cwd=state, env=environment, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2):
                    break
            except OSError:
                if hub.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the hub did not start:\n{(state / 'jupyterhub.log').read_text()}")
                time.sleep(0.5)
        yield base
    finally:
        leftovers = with_descendants([hub.pid])
        hub.terminate()  # the hub stops the servers (scancel) and its proxy
        try:
            hub.wait(timeout=60)
        finally:
            end_processes(leftovers)
            log.close()


def assert_student_can_run_the_course(student: str):
    """The students' jobs run the class's environment as the students: a Python under
    /root (pyenv, conda) fails here, not as a server that never starts."""
    check = subprocess.run(["sudo", "-u", student, str(VENV / "bin" / "python"), "-c",
                            "import coursekit, batchspawner"],
                           capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, (
        f"student {student} cannot run {VENV}/bin/python ({check.stderr.strip()[-300:]}); "
        "build the class environment from a Python every user can read: `make test-clusters` "
        "(CLASS_PYTHON=/usr/bin/python3) or set COURSEKIT_TEST_CLASS_VENV")


def job_size(slurm_env: dict, students: int) -> dict:
    """Partition, cores and memory per student so that every student's job fits on the
    private Slurm's node at once (read back with sinfo, as an instructor would)."""
    out = subprocess.run(["sinfo", "-h", "-o", "%P %c %m"], env=dict(os.environ, **slurm_env),
                         check=True, capture_output=True, text=True, timeout=30).stdout
    partition, cpus, memory = out.split("\n")[0].split()
    return {"COURSEKIT_HUB_PARTITION": partition.rstrip("*"),
            "COURSEKIT_HUB_CPUS": str(max(1, int(cpus) // students)),
            "COURSEKIT_HUB_MEMORY": f"{max(1, int(memory.rstrip('+')) // students)}M",
            "COURSEKIT_HUB_GPUS": "1", "COURSEKIT_HUB_TIME": "00:20:00"}


def squeue(slurm_env: dict, user: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-u", user, "-o", "%i"], env=slurm_env, check=True,
                         capture_output=True, text=True, timeout=30).stdout
    return out.split()


def wait_for(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while (value := check()) and time.monotonic() < deadline:
        time.sleep(1.0)
    assert not value, f"{what} after {timeout:.0f} s: {value}"


@pytest.fixture
def shared_dir():
    """A folder every user can read, like the cluster's shared file system: the students'
    sbatch reads the private slurm.conf in it (pytest's tmp_path is root's alone)."""
    path = Path(tempfile.mkdtemp(prefix="coursekit-hub-"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_two_students_get_slurm_jobs_run_chapter_00_and_leave_nothing(shared_dir):
    assert shutil.which("sudo"), "the hub submits as each student with `sudo -E -u`: apt-get install sudo"
    assert PROXY.is_file(), f"{PROXY} is missing: `make test-clusters` installs it with npm"
    password = secrets.token_urlsafe(12)
    with SlurmCluster(shared_dir / "slurm") as slurm, unix_accounts(2) as names, \
            running_hub(shared_dir / "hub", names, password, {"SLURM_CONF": str(slurm.conf)}) as base:
        slurm.folder.chmod(0o755)  # students' sbatch reads slurm.conf and munge's socket (key: 0400)
        slurm_env = slurm.env
        assert_student_can_run_the_course(names[0])
        students = [Student(base, name) for name in names]
        for student in students:
            student.login(password)
        for student in students:
            student.spawn(timeout=300)
        for student in students:
            [job] = squeue(slurm_env, student.name)
            assert "gpu:1" in slurm.run("squeue", "-h", "-j", job, "-o", "%b")
            result = student.run_notebook(ROOT / "notebooks" / "00_setup.ipynb", extra=WHERE)
            where = json.loads(ast.literal_eval(result))  # text/plain of a str is its repr
            assert where["kernel"][0] == job
            assert [tuple(e) for e in where["engines"]] == [tuple(where["kernel"])] * 2
        for student in students:
            student.stop(timeout=120)
        for student in students:
            wait_for(lambda: squeue(slurm_env, student.name), 60, f"{student.name}'s job still queued")
            wait_for(lambda: [p.pid for p in processes_of(student.name)], 60,
                     f"{student.name}'s processes still running")
