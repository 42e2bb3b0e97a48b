"""Injected worker failures that are safe on a shared cluster.

A crash is **simulated** by default: the worker stops where it is and never talks to its
peers again (a parameter-server worker ends its loop with status ``"crashed"``), so they
see exactly what a dead process shows them: silence, until their timeout declares it lost.
The engine process lives on. That matters on a cluster a notebook attached to (an
instructor's, shared by a class): killing one of its engines takes it from everybody, and
on MPI engines one dead rank ends the whole MPI job.

``crash_kills=True`` (in :class:`~coursekit.parallel.param_server.config.PSConfig`; a data-parallel
crash always ends its process) kills the engine process for real, which only a cluster
the notebook started itself may suffer: :func:`check_may_kill` refuses it on any other.
"""

from __future__ import annotations

__all__ = ["check_may_kill"]


def check_may_kill(cluster, kills: bool, option: str) -> None:
    """ValueError if a run that ends an engine process (``kills``) targets a cluster this
    process did not start (``cluster.owned`` is False); ``option`` names what asked for it."""
    if kills and not getattr(cluster, "owned", True):
        raise ValueError(
            f"{option} would kill an engine process of a cluster this notebook did not start "
            "(an instructor's cluster, maybe shared by the class; on MPI engines one dead rank "
            "ends the whole job). Inject the fault on a cluster you started (cluster.start "
            "without COURSEKIT_CLUSTER)" + (", or leave crash_kills=False: the crash is then "
                                            "simulated and every engine lives on"
                                            if option.startswith("crash_kills") else ""))
