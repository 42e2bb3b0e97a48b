"""A control that picks the transport a panel's engines talk over (``coursekit.transports``).

Panels on a cluster show it beside their other controls; before each run they call
:meth:`TransportControl.apply`, which rebuilds the engines' comms only when the engines
use another transport than the one picked (a Stop's ``prepare`` may have rebuilt them on
the default). Panels on a ``LocalRunner`` (ThreadComm ranks in one process) have no
transport to pick and show no control.
"""

from __future__ import annotations

import ipywidgets as widgets

from coursekit import transports


class TransportControl:
    """``dropdown``: the transports ``cluster``'s engines can use, the current one picked."""

    def __init__(self, cluster, style=None):
        self.dropdown = widgets.Dropdown(options=list(transports.reachable(cluster)),
                                         value=_current(cluster), description="transport",
                                         style=style or {})

    def apply(self, cluster) -> None:
        """Switch ``cluster``'s engines to the picked transport if they use another one."""
        if _current(cluster) != self.dropdown.value:
            transports.use(cluster, self.dropdown.value, timeout=_timeout(cluster))


def control_for(panel_options: dict, style=None) -> TransportControl | None:
    """A TransportControl for a panel that runs on a cluster, else None."""
    cluster = panel_options.get("cluster")
    if cluster is None or panel_options.get("runner") is not None:
        return None
    return TransportControl(cluster, style)


def _current(cluster) -> str:
    from coursekit.comm import call_with_comm
    return cluster.run(call_with_comm, transports.in_use)[0]


def _timeout(cluster) -> float:
    from coursekit.comm import call_with_comm
    return cluster.run(call_with_comm, _comm_timeout)[0]


def _comm_timeout(comm) -> float:
    return comm.timeout
