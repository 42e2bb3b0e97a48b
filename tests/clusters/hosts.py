"""Two hosts on this machine, for engines that really talk across a network.

    with TwoHosts(tmp_path, engines_per_host=2) as hosts:
        hosts.client_file          # ipcontroller-client.json of a controller on host A
        hosts.prefix               # run a command on host A: [*hosts.prefix, "python", ...]

Each host is a network namespace the test creates, joined by a veth pair; the addresses
(10.231.0.1 on A, 10.231.0.2 on B) exist only inside those namespaces. Each host's engines
also get their own host name (UTS namespace) and their own PID namespace, as processes
on separate machines have: ZmqComm's single-copy probe (reading the peer's memory by pid)
then fails between hosts exactly as it does between real machines, and works between
the engines of one host. The controller listens on host A's address and the notebook
kernels run on host A (the root namespace cannot reach these addresses). On exit every
process is killed (each host's PID namespace dies with its first process) and the
namespaces are deleted.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from coursekit.cluster.processes import end_processes

__all__ = ["TwoHosts"]

SUBNET = "10.231.0"
ENGINE_ENV = {"NUMBA_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
              "MKL_NUM_THREADS": "1"}


def ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True, timeout=30)


class TwoHosts:
    """A controller and ``engines_per_host`` engines on each of two namespaced hosts."""

    def __init__(self, folder, *, engines_per_host: int = 2, timeout: float = 60.0):
        self.folder = Path(folder)
        self.engines_per_host, self.timeout = engines_per_host, timeout
        tag = f"ck{os.getpid() % 100000}"
        self.namespaces = {"hostA": f"{tag}a", "hostB": f"{tag}b"}
        self.addresses = {"hostA": f"{SUBNET}.1", "hostB": f"{SUBNET}.2"}
        self.ipython_dir = self.folder / "ipython"
        self.processes: list[subprocess.Popen] = []

    @property
    def prefix(self) -> list[str]:
        """Run a command in host A's network (where the controller is)."""
        return ["ip", "netns", "exec", self.namespaces["hostA"]]

    @property
    def profile_dir(self) -> Path:
        return self.ipython_dir / "profile_twohosts"

    @property
    def client_file(self) -> Path:
        return self.profile_dir / "security" / "ipcontroller-client.json"

    def __enter__(self) -> "TwoHosts":
        try:
            self._network()
            self._start(self.prefix + [str(Path(sys.executable).parent / "ipcontroller"),
                                       "--profile=twohosts", f"--ip={self.addresses['hostA']}",
                                       "--HeartMonitor.period=1000", "--HeartMonitor.max_heartmonitor_misses=30",
                                       "--log-level=40"],
                        "controller")
            engine_file = self.profile_dir / "security" / "ipcontroller-engine.json"
            self._wait(lambda: engine_file.is_file() and self.client_file.is_file(),
                       "the controller's connection files")
            engine = f"{Path(sys.executable).parent / 'ipengine'} --profile=twohosts --log-level=40"
            for host, namespace in self.namespaces.items():
                engines = " & ".join([engine] * self.engines_per_host)
                self._start(["ip", "netns", "exec", namespace, "unshare", "--uts", "--pid",
                             "--fork", "--mount-proc", "--kill-child", "sh", "-c",
                             f'hostname "$0" && {engines} & wait', host], host)
        except BaseException:
            self.__exit__()
            raise
        return self

    def _network(self) -> None:
        a, b = self.namespaces["hostA"], self.namespaces["hostB"]
        for ns in (a, b):
            ip("netns", "add", ns)
        ip("link", "add", f"{a}v", "type", "veth", "peer", "name", f"{b}v")
        for host, ns in self.namespaces.items():
            ip("link", "set", f"{ns}v", "netns", ns)
            ip("-n", ns, "addr", "add", f"{self.addresses[host]}/24", "dev", f"{ns}v")
            ip("-n", ns, "link", "set", f"{ns}v", "up")
            ip("-n", ns, "link", "set", "lo", "up")

    def _start(self, command: list[str], name: str) -> None:
        env = dict(os.environ, IPYTHONDIR=str(self.ipython_dir), **ENGINE_ENV)
        env.pop("COURSEKIT_CLUSTER", None)
        self.folder.mkdir(parents=True, exist_ok=True)
        log = open(self.folder / f"{name}.log", "w")
        self.processes.append(subprocess.Popen(command, env=env, stdout=log,
                                               stderr=subprocess.STDOUT, start_new_session=True))

    def _wait(self, ready, what: str) -> None:
        deadline = time.monotonic() + self.timeout
        while not ready():
            if time.monotonic() > deadline or any(p.poll() is not None for p in self.processes):
                logs = "\n".join(f"== {p.name}\n{p.read_text()[-2000:]}"
                                 for p in sorted(self.folder.glob("*.log")))
                raise RuntimeError(f"waiting for {what} failed\n{logs}")
            time.sleep(0.2)

    def __exit__(self, *exc) -> None:
        import psutil
        processes = []
        for popen in self.processes:
            try:
                proc = psutil.Process(popen.pid)
                processes += [proc, *proc.children(recursive=True)]
            except psutil.NoSuchProcess:
                pass
        end_processes(processes, grace=2.0)
        for popen in self.processes:
            popen.wait(timeout=10)
        self.processes = []
        for ns in self.namespaces.values():  # deleting a namespace deletes its veth end too
            subprocess.run(["ip", "netns", "del", ns], capture_output=True, timeout=30)
