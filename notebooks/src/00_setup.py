# %% [markdown]
# # 00 · Your cluster
#
# Every chapter of this course runs its experiments on a small **cluster**: one
# controller and a few **engines**, each a separate Python process, started by
# [ipyparallel](https://ipyparallel.readthedocs.io). The notebook you are reading
# only orchestrates and plots; the work happens on the engines, the way a training
# job runs on the GPUs of a cluster.
#
# On your laptop `cluster.start(n=4)` starts 4 local engines in about two seconds.
# On an instructor's cluster the same call attaches to the engines already running
# there (the instructor sets `COURSEKIT_CLUSTER`; see the README), so every notebook
# runs unchanged.

# %%
from coursekit import cluster

c = cluster.start(n=4)
c

# %% [markdown]
# ## Ranks
#
# Like MPI processes, the engines are numbered: each knows its **rank**
# (0 … size-1) and the **size** of the cluster. `c.run(fn)` runs `fn` on every
# engine and returns the results in rank order.

# %%
def hello():
    import os
    import socket

    from coursekit.cluster import this_engine

    me = this_engine()
    return {"rank": me.rank, "size": me.size, "host": socket.gethostname(), "pid": os.getpid()}


greetings = c.run(hello)
[(g["rank"], g["size"]) for g in greetings]

# %% [markdown]
# Each engine is its own process: on a laptop all on one host, each with its own pid; on
# a cluster spread over hosts (a pid is only unique on its own host):

# %% tags=["nbval-ignore-output"]
for g in greetings:
    print(f"rank {g['rank']} of {g['size']}: host {g['host']}, pid {g['pid']}")

# %%
len({(g["host"], g["pid"]) for g in greetings}) == c.size

# %% [markdown]
# ## A first ping-pong
#
# The lecture's model of one message of `n` bytes is
#
# $$t = l + \frac{n}{bw}$$
#
# (latency plus size over bandwidth). We send arrays of growing size from this
# notebook to engine 0 and back; a round trip is two messages, so
# $t_{rt}(n) = 2l + 2n/bw$. A straight-line fit gives both numbers. The sizes span six
# orders of magnitude, and a plain least-squares line (`np.polyfit`) minimises *absolute*
# errors: the largest messages' noise then outweighs the small ones, where the latency
# shows. `costmodel.fit` weights each point by $1/t$, i.e. fits *relative* errors, so that
# every size counts alike (chapter 2 fits the same way).

# %%
import numpy as np

from coursekit import costmodel
from coursekit.roundtrip import measure_round_trips

trips = measure_round_trips(c, repeats=5)
fit = costmodel.fit(trips.nbytes, trips.best)  # t_rt = alpha + n beta, relative errors
latency, bandwidth = fit.alpha / 2, 2 / fit.beta
trips.nbytes.tolist()

# %% tags=["nbval-ignore-output"]
slope, intercept = np.polyfit(trips.nbytes, trips.best, 1)  # the unweighted line, to compare


def rms_relative_error(alpha, beta):
    return float(np.sqrt(np.mean(((alpha + beta * trips.nbytes) / trips.best - 1) ** 2)))


weighted_err, plain_err = rms_relative_error(fit.alpha, fit.beta), rms_relative_error(intercept, slope)
print(f"one-way latency   l  ~ {latency * 1e3:.2f} ms   (unweighted polyfit: {intercept / 2 * 1e3:.2f} ms)")
print(f"bandwidth         bw ~ {bandwidth / 1e6:.0f} MB/s (unweighted polyfit: {2 / slope / 1e6:.0f} MB/s)")
print(f"rms relative miss over the sizes: {weighted_err:.1%} (relative-error fit), {plain_err:.1%} (unweighted)")
# the relative-error fit minimises exactly this sum, so no line can do better (rounding aside)
assert weighted_err <= plain_err * (1 + 1e-9), (weighted_err, plain_err)
assert latency > 0 and bandwidth > 0, (latency, bandwidth)
print("PASS: the relative-error fit misses the measured sizes by less (rms) than the unweighted one")

# %%
import matplotlib.pyplot as plt

from coursekit.viz import legend_outside, show

fig, ax = plt.subplots(figsize=(6, 3.5))
ax.loglog(trips.nbytes, trips.best * 1e3, "o", label="measured (best of 5)")
ax.loglog(trips.nbytes, (2 * latency + 2 * trips.nbytes / bandwidth) * 1e3, "-", label="fit $2l + 2n/bw$")
ax.set_xlabel("message size n [bytes]")
ax.set_ylabel("round trip [ms]")
ax.set_title("Notebook → engine 0 → notebook")
legend_outside(ax)
show()

# %% [markdown]
# Small messages cost the latency (milliseconds: every call passes through the
# controller); large ones cost their size over the bandwidth. Collectives and
# training therefore send data **engine to engine** (chapter 2), never through
# this notebook.
#
# ## Reading the numbers
#
# Your numbers will differ from the ones stored in these notebooks. Timings always do (the
# cells that print them say so). A result of training differs too, in its last digits:
# your CPU's float32 kernels (NumPy picks AVX-512, AVX2 or NEON code at run time, and
# OpenBLAS its matrix kernels) round differently from ours, and training amplifies a last-bit
# difference step after step. Such a value is printed after `≈` (test accuracy ≈95.3%),
# and the cell checks what the text claims about it with a tolerance (within a point of the
# uncompressed run, say) rather than its digits.
#
# ## Stop the cluster
#
# `c.stop()` interrupts busy engines and leaves no process behind. The chapters with live
# panels leave their cluster running instead, so the panels still work after Run All: it
# stops when you shut down the kernel (Kernel > Shut Down Kernel), and a watchdog
# (`coursekit.cluster.reaper`) ends it if the kernel is killed.

# %%
c.stop()
c
