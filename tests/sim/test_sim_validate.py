"""The validation experiment's plumbing (on ThreadComm ranks). Its timing claim - simulated
and measured steps within 1.5x on the local cluster - is measured in the chapter-7
notebook and bench/, never asserted here (timings on 2 shared vCPUs are noisy)."""

import numpy as np
import pytest

from coursekit.comm import run_local
import time

from coursekit.sim.calibrate import SIZES, link_fit, pingpong_times, ring_swap_times, swap_times
from coursekit.runner import LocalRunner
from coursekit.sim.validate import measure_and_simulate


def test_calibration_functions_return_on_rank_a_only():
    for fn in (pingpong_times, swap_times):
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
    return ring_swap_times(comm, (8, 4096), 3)


def test_ring_swap_times_reports_the_slowest_rank_on_rank_0():
    out = run_local(_ring_with_slow_rank, 3, 2)
    assert out[1] is None and out[2] is None
    assert out[0].shape == (2,) and np.all(out[0] >= 0.02)
    fast = run_local(_ring_with_slow_rank, 3, -1)[0]
    assert np.all(fast < 0.02)


def test_link_fit_recovers_a_synthetic_link():
    sizes = np.array(SIZES, dtype=float)
    f = link_fit(sizes, 5e-5 + sizes * 2e-10)
    assert f.alpha == pytest.approx(5e-5, rel=1e-6) and f.beta == pytest.approx(2e-10, rel=1e-6)


def test_validate_structure():
    v = measure_and_simulate(LocalRunner(2), 2, sizes=(8, 16, 4), batch=8, steps=4)
    assert v.grad_bytes == 4 * (8 * 16 + 16 + 16 * 4 + 4)
    assert v.simulated_s > v.compute_s > 0 and v.measured_s > 0 and v.ratio > 0
    assert v.alpha > 0 and v.beta > 0 and v.gamma >= 0


def test_validate_needs_two_ranks():
    with pytest.raises(ValueError, match="at least 2"):
        measure_and_simulate(LocalRunner(1), 1)
