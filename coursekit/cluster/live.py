"""Live progress from the workers to the notebook while a run is still going.

Two halves, used by every chapter that trains on engines:

**Worker side** (code a :class:`~coursekit.cluster.runner.Runner` runs on a rank)::

    from coursekit.cluster import live
    reporter = live.Reporter(interval=0.2)       # publishes at most 5 times per second
    for step in range(steps):
        ...
        reporter.log(step=step + 1, total=steps, loss=loss, spans=last_step_spans)
    reporter.close()                             # the final values always go out

``log`` appends numbers to series (``loss`` above becomes a list of every step's loss)
and keeps the latest value of everything else (``step``, ``spans``); it publishes the
whole record, with a sequence number ``seq``, when ``interval`` seconds have passed
since the last publication.
:func:`publish` sends one dict right away. On an ipyparallel engine both go through
``ipyparallel.datapub.publish_data`` (the engine's IOPub channel; the client merges each
dict into ``AsyncResult.data``); on a rank of a :class:`~coursekit.cluster.runner.LocalRunner`
they go to that run's ``data``; anywhere else they are dropped, so worker code needs no
switch.

**Notebook side**::

    run = runner.start(worker_fn, ...)          # a LocalRunner's or a ClusterRunner's Run
    result = live.follow(run, on_update=redraw, total=steps)

(``runner.run(worker_fn, ..., on_update=redraw)`` does both.)

:func:`follow` polls ``ar.data`` every ``interval`` seconds, calls ``on_update(data)``
(``data`` is one dict per rank) when something new arrived, drives a tqdm progress bar
from the smallest ``step`` over the ranks, and returns ``ar.get()``.
"""

from __future__ import annotations

import threading
import time

from tqdm.auto import tqdm

from coursekit import checks

__all__ = ["Reporter", "attach_sink", "follow", "publish"]

_local = threading.local()  # .sink: callable(dict) on a LocalRunner rank


def publish(**fields) -> None:
    """Send ``fields`` to the notebook now (merged into this rank's ``data`` there)."""
    sink = getattr(_local, "sink", None)
    if sink is not None:
        sink(fields)
    elif _on_engine():
        from ipyparallel.datapub import publish_data

        publish_data(fields)


def _on_engine() -> bool:
    from coursekit.cluster import this_engine

    try:
        this_engine()
    except RuntimeError:
        return False
    return threading.current_thread() is threading.main_thread()


class Reporter:
    """Accumulate a worker's progress and publish it at most every ``interval`` seconds.

    Numbers passed to :meth:`log` under a name in ``series`` are appended to a list (the
    full curve goes out each time, so a notebook that polls slowly misses no point);
    anything else is replaced by its latest value.

    ``maxlen`` (an even number, or None: unbounded) bounds the series for a long run: when
    they hold ``maxlen`` points, every other point is dropped and from then on only every
    other call to :meth:`log` adds one (the stride doubles), so the series still span the
    whole run, evenly, in at most ``maxlen`` points, and each publication costs at most
    ``maxlen`` values. Logging calls that carry no series do not count.
    """

    def __init__(self, interval: float = 0.2, series=("loss",), maxlen: int | None = None):
        if not interval >= 0:
            raise ValueError(f"interval must be >= 0 seconds, got {interval!r}")
        if maxlen is not None and (isinstance(maxlen, bool) or not isinstance(maxlen, int)
                                   or maxlen < 2 or maxlen % 2):
            raise ValueError(f"maxlen must be an even int >= 2 or None (unbounded), got {maxlen!r}")
        self.interval = float(interval)
        self.series = tuple(series)
        self.maxlen = maxlen
        self.record: dict = {name: [] for name in self.series}
        self._last = float("-inf")
        self._seq = 0
        self._calls, self._stride = 0, 1  # series calls so far; keep every stride-th

    def log(self, **fields) -> None:
        keep = self._keep() if any(name in self.series for name in fields) else False
        for name, value in fields.items():
            if name not in self.series:
                self.record[name] = value
            elif keep:
                self.record[name].append(value)
        if time.monotonic() - self._last >= self.interval:
            self.flush()

    def _keep(self) -> bool:
        """Whether this call's series values are kept (thinning the series when full)."""
        call, self._calls = self._calls, self._calls + 1
        if self.maxlen is None:
            return True
        if call % self._stride:
            return False
        if max(len(self.record[name]) for name in self.series) >= self.maxlen:
            for name in self.series:
                del self.record[name][1::2]
            self._stride *= 2
        return True

    def flush(self) -> None:
        """Publish the record now."""
        self._last = time.monotonic()
        self._seq += 1
        publish(seq=self._seq,
                **{k: list(v) if k in self.series else v for k, v in self.record.items()})

    def close(self) -> None:
        self.flush()


def attach_sink(sink) -> None:
    """Send what this thread publishes to ``sink(dict)`` (None: detach). A
    :class:`~coursekit.cluster.runner.LocalRunner` attaches each rank's ``data`` dict this way."""
    _local.sink = sink


def _snapshot(result) -> list[dict]:
    data = result.data
    if isinstance(data, dict):  # an AsyncResult of one engine
        data = [data]
    return [dict(d) for d in data]


def _signature(data: list[dict]) -> list:
    """What tells one poll from the next without comparing (possibly array) values."""
    return [(d.get("seq"), d.get("step"), tuple(sorted(d))) for d in data]


def _min_step(data: list[dict]) -> int:
    return min((int(d.get("step", 0)) for d in data), default=0)


OUTPUT_GRACE_S = 5.0  # at most this long for an engine's last data after its result


def follow(result, on_update=None, *, interval: float = 0.2, total: int | None = None,
           desc: str = "steps", progress: bool = True, timeout: float | None = None):
    """Poll ``result.data`` until ``result`` is done; return ``result.get()``.

    ``on_update(data)`` runs in this thread whenever the published data changed (and once
    at the end), with ``data`` a list of one dict per rank. The progress bar shows the
    smallest ``step`` any rank published, out of ``total`` (or the ranks' ``total``).
    ``timeout``: give up (TimeoutError) after that many seconds.
    """
    checks.real(interval, "interval", above=0, hint=" (seconds between updates)")
    checks.callback(on_update, "on_update", "(data), called with one dict per rank,")
    checks.boolean(progress, "progress")
    deadline = None if timeout is None else time.monotonic() + timeout
    bar = tqdm(total=total, desc=desc, disable=not progress, leave=False)
    seen = None
    try:
        while True:
            done = result.wait(interval)
            if done and hasattr(result, "wait_for_output"):
                # ipyparallel: the reply can arrive before the engine's last published data
                # (another channel); its output is complete once that data is in
                result.wait_for_output(OUTPUT_GRACE_S)
            data = _snapshot(result)
            if _signature(data) != seen:
                seen = _signature(data)
                if bar.total is None and data and data[0].get("total"):
                    bar.total = int(data[0]["total"])
                bar.update(_min_step(data) - bar.n)
                if on_update is not None:
                    on_update(data)
            if done:
                break
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"the run did not finish within {timeout} s")
    finally:
        bar.close()
    return result.get()
