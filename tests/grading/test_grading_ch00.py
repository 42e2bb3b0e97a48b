"""The chapter-0 check accepts a relative-error fit and rejects the unweighted one (review item 13)."""

import numpy as np

from coursekit import costmodel
from coursekit.grading.ch00 import check_fit_latency_bandwidth


def weighted(sizes, times):
    slope, intercept = np.polyfit(sizes, times, 1, w=1.0 / times)
    return intercept, 1.0 / slope


def unweighted(sizes, times):
    slope, intercept = np.polyfit(sizes, times, 1)
    return intercept, 1.0 / slope


def test_relative_error_fits_pass():
    assert check_fit_latency_bandwidth(weighted, quiet=True)
    link = lambda n, t: (costmodel.fit(n, t).alpha, costmodel.fit(n, t).bandwidth)  # noqa: E731
    assert check_fit_latency_bandwidth(link, quiet=True)


def test_unweighted_polyfit_fails_on_the_latency_with_a_hint():
    result = check_fit_latency_bandwidth(unweighted, quiet=True)
    assert result.status == "fail"
    assert "expected latency" in str(result) and "w=1/t" in str(result)
