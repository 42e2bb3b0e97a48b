"""Is anybody else using our engines? A timing is only a lesson when nobody is.

Two students attached to one cluster get correct results, but each one's step time then
includes the other's work (measured here: chapter 3's step went from 6-10 ms to 145-188 ms).
:func:`observe`, taken between runs, when no task of ours is pending, finds it out:

* **other clients' tasks** queued or running on our engines: the controller's
  ``queue_status`` (the smaller of two readings, so a result still being booked is not
  counted);
* **how busy each host's CPUs are** over a short window (``psutil.cpu_percent`` on our
  engines, the busiest reading per host): our engines are idle then, so that load is
  somebody else's.

Results stay correct either way; only the times stop meaning what the chapter says.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from coursekit import checks

__all__ = ["BUSY_THRESHOLD", "Contention", "observe"]

#: A host whose CPUs are busier than this while our engines idle has other work on it.
BUSY_THRESHOLD = 0.5


@dataclass(frozen=True)
class Contention:
    """``foreign_tasks``: rank -> other clients' tasks on that engine; ``host_busy``:
    host -> fraction of its CPUs busy (0..1) while our engines were idle."""

    foreign_tasks: dict
    host_busy: dict

    @property
    def disturbed(self) -> bool:
        return any(self.foreign_tasks.values()) or \
            any(busy > BUSY_THRESHOLD for busy in self.host_busy.values())

    def message(self) -> str:
        """One line for a panel: empty when nothing disturbs the timings."""
        if not self.disturbed:
            return ""
        reasons = []
        tasks = {r: n for r, n in self.foreign_tasks.items() if n}
        if tasks:
            reasons.append(f"{sum(tasks.values())} task(s) of other users queued on rank(s) "
                           + ", ".join(map(str, sorted(tasks))))
        reasons += [f"host {host} {busy:.0%} busy without us"
                    for host, busy in sorted(self.host_busy.items()) if busy > BUSY_THRESHOLD]
        return ("timings disturbed: " + "; ".join(reasons) + ". The results are right; the "
                "times include other work, so compare them only with runs on a quiet cluster.")


def _cpu_busy(window: float) -> tuple[str, float]:
    import socket

    import psutil
    return socket.gethostname(), psutil.cpu_percent(interval=window) / 100.0


def _foreign_tasks(cluster) -> dict:
    status = cluster.client.queue_status(targets=cluster.engine_ids)
    return {rank: status[eid]["queue"] + status[eid]["tasks"]
            for rank, eid in enumerate(cluster.engine_ids)}


def observe(cluster, window: float = 0.2) -> Contention:
    """Measure ``cluster`` (a :class:`~coursekit.cluster.CourseCluster`) between runs.

    The CPU reading runs only on engines with no foreign task (it would wait behind one),
    and is skipped on any that does not answer within a few seconds."""
    checks.cluster(cluster)
    checks.real(window, "window", above=0, hint=" (seconds)")
    first = _foreign_tasks(cluster)
    free = [eid for rank, eid in enumerate(cluster.engine_ids) if not first[rank]]
    busiest: dict = {}
    if free:
        readings = cluster.client.direct_view(targets=free).apply_async(_cpu_busy, window)
        if readings.wait(window + 5.0):
            for host, busy in readings.get():
                busiest[host] = max(busy, busiest.get(host, 0.0))
    time.sleep(0.05)
    second = _foreign_tasks(cluster)
    return Contention({r: min(first[r], second[r]) for r in first}, busiest)
