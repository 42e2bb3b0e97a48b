"""What a panel tells a student when a run fails: one readable line, never a traceback.

:func:`error_message` turns an exception from an experiment or from the engines into one
line; :func:`cluster_problem` says, without blocking, whether a cluster has disappeared
(stopped, its controller ended, engines died), so a panel waiting for it can stop waiting.
"""

from __future__ import annotations

import sys

from coursekit.cluster.processes import alive

__all__ = ["cluster_problem", "error_message"]

MAX_CHARS = 600

# Errors whose message is meant for the student as it is; others also show their type.
_PLAIN = (ValueError, TypeError, TimeoutError, RuntimeError)


def _remote_lines(err, cluster) -> list[str] | None:
    """Per-error lines of an ipyparallel remote error (naming the ranks), None for others."""
    ipp = sys.modules.get("ipyparallel")  # no ipyparallel imported: no ipyparallel error
    if ipp is None or not isinstance(err, ipp.error.RemoteError):
        return None
    from coursekit.cluster import failure_lines
    return failure_lines(err, list(getattr(cluster, "engine_ids", ())))


def error_message(err: BaseException, cluster=None) -> str:
    """``err`` as one line: its message (its type too, unless it is a ValueError,
    TypeError, TimeoutError or RuntimeError such as EngineError and CommError), the
    per-rank lines of an ipyparallel remote error joined, at most ``MAX_CHARS`` long."""
    lines = _remote_lines(err, cluster)
    if lines is None:
        if isinstance(err, KeyboardInterrupt):
            return "interrupted"
        text = str(err).strip() or type(err).__name__
        if not isinstance(err, _PLAIN):
            text = f"{type(err).__name__}: {text}"
        lines = text.splitlines()
    text = ""
    for line in (line.strip() for line in lines if line.strip()):
        text += line if not text else (" " if text.endswith(":") else "; ") + line
    return text if len(text) <= MAX_CHARS else text[:MAX_CHARS - 3] + "..."


def cluster_problem(cluster) -> str | None:
    """Why ``cluster`` (a :class:`coursekit.cluster.CourseCluster`) cannot run anything any
    more, or None if it looks alive (and for None). Never blocks: it looks at the
    controller's process (of a cluster started here) and at the engines the client
    still knows."""
    if cluster is None:
        return None
    if getattr(cluster, "_stopped", False):
        return "it was stopped"
    ipp_cluster = getattr(cluster, "ipp_cluster", None)
    if ipp_cluster is not None:
        controller = ipp_cluster.controller
        process = getattr(controller, "process", None)
        if controller is None or (process is not None and not alive(process)):
            return "its controller ended"
    known = set(cluster.client.ids)
    lost = [rank for rank, eid in enumerate(cluster.engine_ids) if eid not in known]
    if lost:
        return f"engine(s) of rank {', '.join(map(str, lost))} died"
    return None
