"""ipyparallel launchers whose processes the cluster's reaper starts, not the kernel.

A :class:`ReapedCluster` is ipyparallel's ``Cluster`` with a :class:`coursekit.cluster.reaper.Reaper`;
its controller and engine launchers (local engines, or ``mpiexec`` for MPI engines) ask that
reaper to start their command line instead of starting it themselves, so the controller,
the engines and everything they start are the reaper's descendants, and end with the kernel
however it ends (see :mod:`coursekit.cluster.reaper`).

Everything else is ipyparallel's: the launcher still signals and stops its process, reads
its output file and notices when it ends (psutil waits for a process that is not its child
by polling its PID, every 40 ms at most). A launcher without a reaper above it starts its
process itself, as ipyparallel's does.
"""

from __future__ import annotations

import os

import ipyparallel as ipp
import psutil
from ipyparallel.cluster.launcher import (
    LocalControllerLauncher,
    LocalEngineLauncher,
    LocalEngineSetLauncher,
    LocalProcessLauncher,
    MPIEngineSetLauncher,
    ProcessStateError,
)
from traitlets import Any

__all__ = ["ENGINE_LAUNCHERS", "ReapedCluster", "ReapedController", "ReapedEngineSet",
           "ReapedMPIEngineSet"]


class ReapedCluster(ipp.Cluster):
    """An ipyparallel ``Cluster`` whose launchers start their processes through ``reaper``."""

    reaper = Any(None, help="the coursekit.cluster.reaper.Reaper that starts this cluster's processes")


class ReapedProcess(LocalProcessLauncher):
    """``LocalProcessLauncher.start`` with the reaper in place of ``Popen``."""

    def find_reaper(self):
        """The reaper of the :class:`ReapedCluster` above this launcher, or None."""
        parent = self.parent
        while parent is not None and not isinstance(parent, ReapedCluster):
            parent = getattr(parent, "parent", None)
        return parent.reaper if parent is not None else None

    def start(self):
        reaper = self.find_reaper()
        if reaper is None:
            return super().start()
        if self.state != "before":
            raise ProcessStateError(f"The process was already started and has state: {self.state}")
        pid = reaper.spawn(self.args, env={**os.environ, **self.get_env()}, cwd=self.work_dir,
                           output_file=self.output_file)
        self.pid = pid
        try:
            self.process = psutil.Process(pid)
        except psutil.NoSuchProcess:
            raise ProcessStateError(f"{' '.join(self.args)} exited at once; its output: "
                                    f"{self.get_output()}") from None
        self.notify_start(pid)
        self._start_waiting()


# ReapedProcess after the ipyparallel class: their start() ends in LocalProcessLauncher's,
# which the method resolution order then finds in ReapedProcess.
# entrypoint_name: how ipyparallel's cluster file names the class, so that `ipcluster list`
# can import it again (its own "module:Class" form fails to import)
class ReapedController(LocalControllerLauncher, ReapedProcess):
    """The controller, started by the reaper."""

    entrypoint_name = "coursekit.cluster.launchers.ReapedController"


class ReapedEngine(LocalEngineLauncher, ReapedProcess):
    """One engine, started by the reaper."""

    entrypoint_name = "coursekit.cluster.launchers.ReapedEngine"


class ReapedEngineSet(LocalEngineSetLauncher):
    """Local engines, each started by the reaper."""

    entrypoint_name = "coursekit.cluster.launchers.ReapedEngineSet"
    launcher_class = ReapedEngine


class ReapedMPIEngineSet(MPIEngineSetLauncher, ReapedProcess):
    """``mpiexec`` and so its MPI engines, started by the reaper."""

    entrypoint_name = "coursekit.cluster.launchers.ReapedMPIEngineSet"


ENGINE_LAUNCHERS = {"local": ReapedEngineSet, "mpi": ReapedMPIEngineSet}
