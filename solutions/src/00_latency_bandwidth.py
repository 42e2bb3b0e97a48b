# %% [markdown]
# # Exercise 00 · Fit latency and bandwidth
#
# A message of `n` bytes costs $t(n) = l + n / bw$: a fixed **latency** `l`
# (seconds) plus the size over the **bandwidth** `bw` (bytes per second).
# Given measured `(n, t)` pairs, estimate `l` and `bw` by least squares:
# `t` is a straight line in `n` with intercept `l` and slope `1 / bw`.
#
# Write `fit_latency_bandwidth`, then run the check below it.

# %%
import numpy as np

from coursekit.grading.ch00 import check_fit_latency_bandwidth


def fit_latency_bandwidth(sizes, times):
    """Least-squares fit of t = l + n / bw; returns (l in s, bw in bytes/s)."""
    ### BEGIN SOLUTION: fit a straight line t = a + b*n (np.polyfit or lstsq), return (a, 1/b)
    slope, intercept = np.polyfit(np.asarray(sizes, float), np.asarray(times, float), 1)
    return intercept, 1.0 / slope
    ### END SOLUTION


# %%
check_fit_latency_bandwidth(fit_latency_bandwidth)

# %% [markdown]
# ## Now on your cluster
#
# Measure round trips notebook → engine → notebook. A round trip is two
# messages, so fit the one-way time `t / 2`.

# %%
# NBVAL_IGNORE_OUTPUT
from coursekit import cluster
from coursekit.roundtrip import measure_round_trips

with cluster.start(n=2) as c:  # the cluster stops when the block ends, even on errors
    trips = measure_round_trips(c, repeats=5)
latency, bandwidth = fit_latency_bandwidth(trips.nbytes, trips.best / 2)
assert latency > 0 and bandwidth > 0
print(f"one-way latency l ~ {latency * 1e3:.2f} ms, bandwidth bw ~ {bandwidth / 1e6:.0f} MB/s")
