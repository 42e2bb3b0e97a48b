"""A private, real Slurm on this machine, for the cluster tests (Debian's slurm-wlm, munge).

    with SlurmCluster(tmp_path, gpus=4) as slurm:
        subprocess.run(["sbatch", ...], env=slurm.env)   # env: SLURM_CONF of this Slurm
        slurm.partition                                  # "gpu"
        slurm.node                                       # "ck1"

Everything lives in the given folder: a munge key and its own ``munged`` (own socket, so
the system's munge is untouched), a generated ``slurm.conf`` with free loopback ports,
state, spool, pid and log files. ``slurmctld`` and ``slurmd`` run in the foreground as
children of the test. One node, ``ck1`` on 127.0.0.1, offers ``cpus`` CPUs (more than the
machine has, as a real GPU node does: ``SlurmdParameters=config_overrides``) and ``gpus``
GPUs as a GRES of placeholder files, so batch scripts that ask ``--gres=gpu:N`` are scheduled as on
a GPU partition (the tasks see no device: there is none here). Debian's build cannot run
several ``slurmd`` on one machine (that needs ``--enable-multiple-slurmd``), so a second
node is not offered. On exit every job is cancelled and every process of this Slurm
(daemons, job steps, jobs) ended; one that outlives it is an error.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from pathlib import Path

from coursekit.cluster.processes import end_processes

__all__ = ["SlurmCluster", "SlurmError"]


class SlurmError(RuntimeError):
    """The private Slurm did not come up; the message has its daemons' logs."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SLURM_CONF = """\
ClusterName=coursekit
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={folder}/munge.socket
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
SlurmctldTimeout=30
SlurmdTimeout=30
InactiveLimit=0
KillWait=5
GresTypes=gpu
NodeName={node} NodeHostname={host} NodeAddr=127.0.0.1 CPUs={cpus} Gres=gpu:{gpus} State=UNKNOWN
PartitionName={partition} Nodes={node} Default=YES MaxTime=INFINITE State=UP OverSubscribe=NO
"""


class SlurmCluster:
    """Start a one-node Slurm in ``folder`` (see the module docstring)."""

    def __init__(self, folder, *, cpus: int = 32, gpus: int = 4, partition: str = "gpu",
                 node: str = "ck1", timeout: float = 60.0):
        self.folder = Path(folder)
        self.cpus, self.gpus, self.partition, self.node = cpus, gpus, partition, node
        self.timeout = timeout
        self.daemons: list[subprocess.Popen] = []

    @property
    def conf(self) -> Path:
        return self.folder / "slurm.conf"

    @property
    def env(self) -> dict:
        """The environment that points Slurm's commands at this Slurm."""
        return dict(os.environ, SLURM_CONF=str(self.conf))

    def run(self, *command: str, check: bool = True) -> str:
        """A Slurm command (sinfo, squeue, sbatch, scancel ...) against this Slurm; its stdout."""
        done = subprocess.run(command, env=self.env, capture_output=True, text=True, timeout=30)
        if check and done.returncode != 0:
            raise SlurmError(f"{' '.join(command)} failed ({done.returncode}): {done.stderr}")
        return done.stdout

    def __enter__(self) -> "SlurmCluster":
        for tool in ("munged", "slurmctld", "slurmd", "sbatch"):
            if shutil.which(tool) is None and not Path("/usr/sbin", tool).exists():
                raise SlurmError(f"{tool} is missing: apt-get install slurm-wlm munge (.ci/run does)")
        self.folder.mkdir(parents=True, exist_ok=True)
        for sub in ("state", "spool"):
            (self.folder / sub).mkdir(exist_ok=True)
        try:
            self._start_munge()
            self._write_conf()
            self.daemons.append(self._daemon("/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.conf)))
            self.daemons.append(self._daemon("/usr/sbin/slurmd", "-D", "-N", self.node,
                                             "-f", str(self.conf)))
            self._wait_idle()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _daemon(self, *command: str) -> subprocess.Popen:
        log = open(self.folder / f"{Path(command[0]).name}.out", "w")
        return subprocess.Popen(command, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)

    def _start_munge(self) -> None:
        key = self.folder / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o400)
        self.folder.chmod(0o700)
        self.daemons.append(self._daemon(
            "/usr/sbin/munged", "--foreground", "--force", f"--key-file={key}",
            f"--socket={self.folder}/munge.socket", f"--pid-file={self.folder}/munged.pid",
            f"--log-file={self.folder}/munged.log", f"--seed-file={self.folder}/munged.seed"))
        self._wait(lambda: (self.folder / "munge.socket").exists(), "munged's socket")

    def _write_conf(self) -> None:
        self.conf.write_text(SLURM_CONF.format(
            host=socket.gethostname(), ctld_port=free_port(), slurmd_port=free_port(),
            folder=self.folder, node=self.node, cpus=self.cpus, gpus=self.gpus,
            partition=self.partition))
        # GPUs as files: slurmd counts the File= entries (a count alone reports 0 GPUs)
        for i in range(self.gpus):
            (self.folder / f"gpu{i}").touch()
        (self.folder / "gres.conf").write_text("".join(
            f"NodeName={self.node} Name=gpu File={self.folder}/gpu{i}\n" for i in range(self.gpus)))

    def _wait_idle(self) -> None:
        def idle():
            done = subprocess.run(["sinfo", "-h", "-n", self.node, "-o", "%t"], env=self.env,
                                  capture_output=True, text=True, timeout=10)
            return done.returncode == 0 and done.stdout.strip() == "idle"
        self._wait(idle, f"node {self.node} idle in sinfo")

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + self.timeout
        while not ready():
            dead = [d.args[0] for d in self.daemons if d.poll() is not None]
            if dead or time.monotonic() > deadline:
                why = f"{dead} exited" if dead else f"not within {self.timeout} s"
                raise SlurmError(f"waiting for {what}: {why}\n{self.logs()}")
            time.sleep(0.2)

    def logs(self) -> str:
        return "\n".join(f"== {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                         for p in sorted(self.folder.glob("*.log")) + sorted(self.folder.glob("*.out")))

    def processes(self) -> list:
        """Every process of this Slurm: its daemons, their job steps (``slurmstepd`` leaves
        its parent, slurmd) and the jobs' programs; all inherit this Slurm's SLURM_CONF."""
        import psutil
        mine = []
        for proc in psutil.process_iter():
            try:
                if proc.pid != os.getpid() and proc.environ().get("SLURM_CONF") == str(self.conf):
                    mine.append(proc)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                pass
        return mine

    def __exit__(self, *exc) -> None:
        if any(d.poll() is None for d in self.daemons[1:]):
            subprocess.run(["scancel", "--full", "--partition", self.partition], env=self.env,
                           capture_output=True, timeout=30)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline and self.run("squeue", "-h", check=False).strip():
                time.sleep(0.3)
        end_processes(self.processes())
        for daemon in self.daemons:
            daemon.wait(timeout=10)
        self.daemons = []
        if survivors := self.processes():
            raise SlurmError(f"processes of this Slurm outlived it: {survivors}")
