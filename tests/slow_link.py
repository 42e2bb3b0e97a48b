"""A link of known latency for tests: ThreadComm ranks whose every message waits first."""

from __future__ import annotations

import time

from coursekit.cluster.runner import LocalRunner


class SlowLinkRunner(LocalRunner):
    """``LocalRunner(size)`` whose ranks hold every message ``delay`` seconds before posting
    it (barriers included): a link whose alpha is ``delay`` plus the threads' own."""

    def __init__(self, size: int, delay: float, **kwargs):
        super().__init__(size, **kwargs)
        self.delay = delay

    def start(self, fn, *args, ranks=None, may_die=(), **kwargs):
        return super().start(_with_delay, self.delay, fn, *args, ranks=ranks, may_die=may_die,
                             **kwargs)


def _with_delay(comm, delay, fn, *args, **kwargs):
    post = comm._post

    def delayed(*message):
        time.sleep(delay)
        return post(*message)

    comm._post = delayed
    return fn(comm, *args, **kwargs)
