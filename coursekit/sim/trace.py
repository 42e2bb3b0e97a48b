"""Record the messages a real collective sends, for :func:`coursekit.sim.replay`."""

from __future__ import annotations

import numpy as np

from coursekit import checks
from coursekit.collectives import FUNCTIONS
from coursekit.collectives.hierarchical import hierarchical_allreduce
from coursekit.comm import run_local
from coursekit.comm.trace import recording

from .replay import programs_from_traces

__all__ = ["trace_collective"]


def _run(comm, collective, algorithm, items, ranks_per_node):
    x = np.ones(items, dtype=np.float32)
    with recording(comm) as messages:
        if algorithm == "hierarchical":
            hierarchical_allreduce(comm, x, ranks_per_node=ranks_per_node, check=False)
        else:
            FUNCTIONS[collective](comm, x, algorithm=algorithm, check=False)
        return list(messages())


def trace_collective(p: int, nbytes: int, algorithm: str = "ring", *,
                     collective: str = "allreduce", ranks_per_node: int = 1) -> list[list]:
    """Run ``collective`` for real on p ThreadComm ranks (float32, ``check=False``) and
    return every rank's program (:func:`programs_from_traces`).

    ``algorithm="hierarchical"`` runs :func:`hierarchical_allreduce` with ``ranks_per_node``.
    """
    if collective not in FUNCTIONS:
        raise ValueError(f"unknown collective {collective!r}; allowed: {', '.join(FUNCTIONS)}")
    checks.integer(nbytes, "nbytes", at_least=4, hint=" (a multiple of 4: float32 items)")
    if nbytes % 4:
        raise ValueError(f"nbytes must be a positive multiple of 4 (float32), got {nbytes!r}")
    ranks_per_node = checks.integer(ranks_per_node, "ranks_per_node", at_least=1)
    checks.fits_in_memory(2 * nbytes, "nbytes", "one rank's input and output")
    traces = run_local(_run, p, collective, algorithm, nbytes // 4, ranks_per_node)
    return programs_from_traces(traces)
