# %% [markdown]
# # Exercise 00 · Fit latency and bandwidth
#
# A message of `n` bytes costs $t(n) = l + n / bw$: a fixed **latency** `l`
# (seconds) plus the size over the **bandwidth** `bw` (bytes per second).
# Given measured `(n, t)` pairs, estimate `l` and `bw` by least squares:
# `t` is a straight line in `n` with intercept `l` and slope `1 / bw`.
#
# Sizes span seven orders of magnitude, and so do times. A plain least-squares line
# minimises *absolute* errors, so a 2 % wobble on the largest message (milliseconds)
# outweighs the whole latency (microseconds) and the intercept can come out anywhere,
# even negative. Fit **relative** errors instead: weight each point by $1/t$ (then every
# size counts alike; `coursekit.costmodel.fit` does the same). The check includes noisy
# curves and checks the latency too.
#
# Write `fit_latency_bandwidth`, then run the check below it.

# %%
import numpy as np

from coursekit.grading.ch00 import check_fit_latency_bandwidth


def fit_latency_bandwidth(sizes, times):
    """Least-squares fit of t = l + n / bw; returns (l in s, bw in bytes/s)."""
    # Hint: fit a straight line t = a + b*n weighting each point by 1/t (np.polyfit(..., w=) or lstsq), return (a, 1/b)
    ### BEGIN SOLUTION
    sizes, times = np.asarray(sizes, float), np.asarray(times, float)
    slope, intercept = np.polyfit(sizes, times, 1, w=1.0 / times)  # relative errors
    return intercept, 1.0 / slope
    ### END SOLUTION


# %%
check_fit_latency_bandwidth(fit_latency_bandwidth)

# %% [markdown]
# ## Now on your cluster
#
# Measure round trips notebook → engine → notebook. A round trip is two
# messages, so fit the one-way time `t / 2`.

# %% tags=["nbval-ignore-output"]
from coursekit import cluster
from coursekit.roundtrip import measure_round_trips

with cluster.start(n=2) as c:  # the cluster stops when the block ends, even on errors
    trips = measure_round_trips(c, repeats=5)
latency, bandwidth = fit_latency_bandwidth(trips.nbytes, trips.best / 2)
# stated bounds: a message through the controller costs milliseconds (above 0.05 ms, below
# 0.1 s even on a busy machine); no link on one host is faster than memory (~10 GB/s here)
assert 5e-5 < latency < 0.1 and 1e6 < bandwidth < 1e11, (latency, bandwidth)
print(f"one-way latency l ~ {latency * 1e3:.2f} ms, bandwidth bw ~ {bandwidth / 1e6:.0f} MB/s")
