# %% [markdown]
# # Exercise 04 · The SSP clock gate
#
# A parameter-server shard keeps every worker's **clock**: the number of iterations it
# has pushed. Under **stale synchronous parallel** (SSP) with staleness bound `s`, a
# worker that asks for the weights before its iteration `clock` gets an answer only when
#
# $$\text{clock} - \min_{\text{live workers } j} \text{clock}_j \;\le\; s,$$
#
# i.e. it is at most `s` iterations ahead of the slowest live worker. Until then the
# shard keeps the request waiting (the worker idles). The shard averages the gradients of
# iteration `k` and applies them once every live worker has pushed iteration `k`, so a
# worker released at `clock` reads weights that contain all iterations before
# `clock - s`: the gradient it computes is applied at most `s` versions late.
#
# * `s = 0` is BSP: everyone waits for everyone at every step.
# * `s = ∞` would be ASP, except that SSP still averages per iteration.
#
# Write the gate the shard asks before answering a pull. `clocks` holds the clocks of the
# live workers (a NumPy int array; the asking worker's own clock is among them; workers
# declared lost are not). Return `True` to answer now, `False` to keep the worker waiting.
#
# The check asks your gate about small cases, then runs the real parameter server
# (threads in this process, random delays) with it: no gradient may be staler than `s`,
# the slowest worker must never be blocked (that would deadlock), and `s = 0` must give
# exactly BSP's weights.

# %%
import matplotlib.pyplot as plt
import numpy as np

from coursekit.grading.ch04 import check_ssp_gate
from coursekit.viz import integer_ticks, show


def ssp_gate(clock, clocks, staleness):
    """True if a worker at ``clock`` may proceed: clock - min(clocks) <= staleness."""
    # Hint: compare how far clock is ahead of the slowest clock with the bound
    ### BEGIN SOLUTION
    return bool(clock - np.min(clocks) <= staleness)
    ### END SOLUTION


# %%
check_ssp_gate(ssp_gate)

# %% [markdown]
# ## Your gate at work
#
# Three workers, the third one 30 ms slower per step than the others, for 20 steps. A
# larger bound lets the two fast workers run up to `s` steps ahead, so they wait about
# `s` x 30 ms less in all, out of about 20 x 30 ms: little, because a worker that is slow
# at every step still sets the pace (SSP absorbs transient slowness: chapter 4's jitter
# run). What the bound changes is staleness: the histogram spreads, never beyond `s`. The
# cell checks both; thread timing on a busy machine can hide the two-step bound's saving
# (60 ms), so only the six-step bound's (180 ms) is.

# %% tags=["nbval-ignore-output"]
from coursekit.data import load_digits
from coursekit.parallel.param_server import PSConfig, train
from coursekit.cluster.runner import LocalRunner

digits = load_digits()
bounds = (0, 2, 6)
results = {}
fig, axes = plt.subplots(1, len(bounds), figsize=(10, 2.8), sharey=True, layout="constrained")
for ax, s in zip(axes, bounds):
    config = PSConfig(model="ssp", staleness=s, steps=20, straggler={2: 0.030})
    result = results[s] = train(LocalRunner(4), config, digits, workers=3, gate=ssp_gate)
    values, counts = np.unique(result.staleness, return_counts=True)
    ax.bar(values, counts)
    ax.set(title=f"s = {s}: max staleness {result.staleness.max()}", xlabel="staleness")
    integer_ticks(ax, "xy")
axes[0].set_ylabel("applied gradients")
show()
fast_idle = {s: 1e3 * np.nanmean(r.idle_s[:2]) for s, r in results.items()}
print("the fast workers' idle time (ms):", {s: round(t) for s, t in fast_idle.items()})
print("mean staleness:", {s: round(float(r.staleness.mean()), 2) for s, r in results.items()})
assert all(r.staleness.max() <= s for s, r in results.items())
assert results[0].staleness.mean() < results[2].staleness.mean() < results[6].staleness.mean()
assert fast_idle[6] < fast_idle[0]
# at s = 0 the fast workers wait ~30 ms for the straggler at each of 20 steps (~600 ms);
# a third of that leaves room for a busy machine
assert fast_idle[0] > 20 * 30 / 3, fast_idle
