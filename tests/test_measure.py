"""coursekit.measure: the rank-side timers, their formulas (on a fake clock), the fits on a
link of known latency, gamma, and the argument checks. Timings on 2 shared vCPUs are
noisy, so real clocks are only held to what a known injected delay makes sure."""

import re
import threading
import time
from types import SimpleNamespace

import numpy as np
import pytest
from slow_link import SlowLinkRunner

from coursekit import measure
from coursekit.comm import run_local
from coursekit.costmodel import LinkFit
from coursekit.cluster.runner import LocalRunner

THREADS = LocalRunner(3)


@pytest.fixture
def fake_clock(monkeypatch):
    """measure's clock: every thread's perf_counter advances exactly 1 ms per call."""
    calls = threading.local()

    def perf_counter():
        calls.n = getattr(calls, "n", 0) + 1
        return calls.n * 1e-3

    monkeypatch.setattr(measure, "time", SimpleNamespace(perf_counter=perf_counter))


def test_the_formulas_on_a_clock_where_every_exchange_takes_1_ms(fake_clock):
    sizes = (8, 1024)
    ping = run_local(measure.pingpong_times, 2, sizes, 3)[0]
    swap = run_local(measure.swap_times, 2, sizes, 3)[0]
    ring = run_local(measure.ring_swap_times, 3, sizes, 3)[0]
    assert ping.tolist() == pytest.approx([0.5e-3] * 2)  # one-way = round trip / 2
    assert swap.tolist() == pytest.approx([1e-3] * 2) and ring.tolist() == pytest.approx([1e-3] * 2)
    assert measure.gamma(LocalRunner(1), 4096, 3) == pytest.approx(1e-3 / 4096)  # per byte
    flat = measure.link(LocalRunner(2), "pingpong", sizes, 3)
    assert flat.alpha == pytest.approx(0.5e-3) and flat.beta == 1e-15  # clipped: no free link


def test_a_burst_of_load_spreads_over_the_sizes_instead_of_hitting_one(fake_clock):
    """The machine is busy for the first 12 calls (each then takes 4 clock ticks more):
    timed one size after the other, the first size's median would be the burst's. In
    sweeps every size gets a few slow calls and a median of quiet ones; and every visit
    to a size begins with an untimed call."""
    calls = []

    def operation(send, recv):
        calls.append(send.size)
        if len(calls) <= 12:
            for _ in range(4):
                measure.time.perf_counter()

    sizes, repeats = (8, 64, 512), 3 * measure.VISIT
    times = measure._rounds(operation, sizes, repeats)
    assert times.shape == (repeats, 3)
    assert np.median(times, axis=0).tolist() == pytest.approx([1e-3] * 3)  # quiet: 1 tick a call
    assert all(np.any(times[:, i] > 1e-3) for i in range(2))  # the burst touched two sizes
    visit = [n for n in sizes for _ in range(measure.VISIT + 1)]
    assert calls == visit * 3


def test_pair_timers_return_on_rank_a_only():
    for fn in (measure.pingpong_times, measure.swap_times):
        out = run_local(fn, 3, (8, 1024), 2, 0, 2)
        assert out[1] is None and out[2] is None
        assert out[0].shape == (2,) and np.all(out[0] > 0)


def _ring_with_slow_rank(comm, slow):
    if comm.rank == slow:
        fast = comm.sendrecv

        def sendrecv(*args, **kw):  # slow after the message: only this rank's time grows
            got = fast(*args, **kw)
            time.sleep(0.02)
            return got
        comm.sendrecv = sendrecv
    return measure.ring_swap_times(comm, (8, 4096), 3)


def test_ring_swap_times_reports_the_slowest_rank_on_rank_0():
    out = run_local(_ring_with_slow_rank, 3, 2)
    assert out[1] is None and out[2] is None
    assert out[0].shape == (2,) and np.all(out[0] >= 0.02)
    fast = run_local(_ring_with_slow_rank, 3, -1)[0]
    assert np.all(fast < 0.02)


def test_link_fit_recovers_a_synthetic_link_and_keeps_its_points():
    sizes = np.array(measure.SIZES, dtype=float)
    times = 5e-5 + sizes * 2e-10
    f = measure.link_fit(sizes, times, "swap")
    assert isinstance(f, LinkFit) and f.pattern == "swap"
    assert f.alpha == pytest.approx(5e-5, rel=1e-6) and f.beta == pytest.approx(2e-10, rel=1e-6)
    assert f.sizes.tolist() == sizes.tolist() and f.times.tolist() == times.tolist()
    assert f(1 << 20) == pytest.approx(5e-5 + 2e-10 * (1 << 20))
    tilted = measure.link_fit([2000, 4000, 8000], [1e-6, 3e-6, 7e-6])  # -1 us + n * 1 ns
    assert tilted.alpha == 1e-9 and tilted.beta == pytest.approx(1e-9)  # no link is free


@pytest.mark.parametrize("pattern", measure.PATTERNS)
def test_link_recovers_an_injected_latency(pattern):
    delay = 0.02  # far above the threads' own latency, so load on the machine cannot hide it
    f = measure.link(SlowLinkRunner(2, delay), pattern, (8, 1024, 65536), repeats=3)
    assert 0.9 * delay < f.alpha < 1.5 * delay, f
    assert 0 < f.beta < 1e-7 and f.times.shape == (3,)  # faster than 10 MB/s: a memcpy


def test_gamma_is_seconds_per_byte_of_an_add():
    g = measure.gamma(THREADS, 1 << 20, 3)
    assert 1e-13 < g < 1e-8  # between 100 GB/s and 0.1 GB/s: per byte, not per array


@pytest.mark.parametrize("call, error, says", [
    (lambda: measure.link(2, "pingpong"), TypeError, "runner must be a Runner"),
    (lambda: measure.link(THREADS, "ping"), ValueError, "allowed: pingpong, swap, ring"),
    (lambda: measure.link(THREADS, sizes=[8, 8]), ValueError, "two different message sizes"),
    (lambda: measure.link(THREADS, sizes=[0, 8]), ValueError, "sizes must be >= 1"),
    (lambda: measure.link(THREADS, sizes=[8, 9.5]), ValueError, "whole numbers of bytes"),
    (lambda: measure.link(THREADS, sizes="8"), TypeError, "sizes must be real numbers"),
    (lambda: measure.link(THREADS, repeats=0), ValueError, "repeats=0: must be >= 1"),
    (lambda: measure.link(THREADS, a=1, b=1), ValueError, "two different ranks"),
    (lambda: measure.link(THREADS, b=3), ValueError, "b=3: must be in"),
    (lambda: measure.link(THREADS, "swap", ranks=2), ValueError, "ranks= sizes the 'ring'"),
    (lambda: measure.link(THREADS, "ring", a=1, b=2), ValueError, "a 'ring' runs on the first `ranks`"),
    (lambda: measure.link(THREADS, "ring", ranks=1), ValueError, "ranks >= 2"),
    (lambda: measure.link(THREADS, "ring", ranks=4), ValueError, "ranks=4: must be"),
    (lambda: measure.link_fit([8, 16], [1e-6, 2e-6], "tree"), ValueError, "allowed: pingpong"),
    (lambda: measure.gamma(THREADS, 0), ValueError, "nbytes=0: must be >= 4"),
    (lambda: measure.gamma(THREADS, 1.5), TypeError, "nbytes must be an integer"),
    (lambda: measure.gamma(THREADS, repeats=True), TypeError, "repeats must be an integer"),
    (lambda: measure.gamma(THREADS, ranks=0), ValueError, "ranks=0"),
])
def test_bad_arguments_are_refused_before_any_rank_starts(call, error, says):
    with pytest.raises(error, match=re.escape(says)):
        call()
