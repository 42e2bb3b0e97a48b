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
ranks = [(g["rank"], g["size"]) for g in greetings]
assert ranks == [(r, c.size) for r in range(c.size)], ranks  # rank order, one size
ranks

# %% [markdown]
# Each engine is its own process: on a laptop all on one host, each with its own pid; on
# a cluster spread over hosts (a pid is only unique on its own host):

# %% tags=["nbval-ignore-output"]
for g in greetings:
    print(f"rank {g['rank']} of {g['size']}: host {g['host']}, pid {g['pid']}")

# %%
assert len({(g["host"], g["pid"]) for g in greetings}) == c.size
print(f"PASS: {c.size} engines, {c.size} distinct processes")

# %% [markdown]
# ## The machine you are on
#
# A node of a training cluster is one computer: one or more CPU **sockets** (chips), each
# with several **cores**, each core running one or more **hardware threads** (SMT, Intel's
# Hyper-Threading: two per core). The operating system sees every hardware thread as a logical CPU:
#
# $$\text{logical CPUs} = \text{sockets} \times \text{cores per socket} \times \text{threads per core}$$
#
# All of them share the node's memory. With one memory controller every core reaches every
# byte at the same cost: **UMA** (uniform memory access, a laptop). A server with two
# sockets has a memory controller on each, so each core has near memory (its socket's) and
# far memory (behind the link between the sockets, slower): **NUMA** (non-uniform memory
# access). The cores and memory of one controller form a **NUMA node**. Each core has its
# own small, fast L1 and L2 caches; a larger L3 is shared by the cores of a socket (or a part
# of one). The **GPUs** (usually 4 or 8 per node) sit on the sockets' PCIe lanes, so each GPU
# too is nearer to one socket than to the other.
#
# `read_node()` reads all of this from the machine: on Linux from `/sys` (or `lscpu`),
# elsewhere the number of logical CPUs only. This machine differs from yours, so what the cell
# prints is not compared with the stored notebook; it checks the relations that hold on any machine:
# the product above equals the logical CPUs and `os.cpu_count()`, the NUMA nodes hold each
# CPU once, and the copies of each cache level times the CPUs that share one give the
# logical CPUs (each where the machine reports it).

# %% tags=["nbval-ignore-output"]
import os

from coursekit.cluster.node_anatomy import placement, read_node

node = read_node()
print(node.describe())
assert node.logical_cpus == os.cpu_count(), (node.logical_cpus, os.cpu_count())
assert node.problems() == [], node.problems()
if None not in (node.sockets, node.cores_per_socket, node.threads_per_core):
    assert node.sockets * node.cores_per_socket * node.threads_per_core == os.cpu_count()
print("PASS: sockets x cores per socket x threads per core = logical CPUs = os.cpu_count(); "
      "the NUMA nodes and each cache level hold every CPU once (as far as reported)")

# %% [markdown]
# Where do the engines run? On a laptop, on this one node: every engine, the controller and
# this kernel are processes of the same machine and share its cores. The operating system
# runs each process on whichever allowed CPU is free and moves it as it likes (the engines
# are not pinned), so more engines than cores take turns, and a timing measured on one engine
# includes waiting for the others. On a NUMA node a process that moves to the other socket
# reads its memory through the link between the sockets. Cluster launchers therefore pin each
# rank to the cores of the socket nearest to its GPU (Slurm's `--cpu-bind`, `numactl
# --cpunodebind`). `placement()` run on the engines shows where they are:

# %% tags=["nbval-ignore-output"]
import socket

places = c.run(placement)
for rank, p in enumerate(places):
    allowed = "not reported" if p["allowed"] is None else ",".join(map(str, p["allowed"]))
    print(f"engine {rank}: host {p['host']}, pid {p['pid']}, allowed CPUs {allowed}, "
          f"last ran on CPU {p['cpu']}")
local = [p for p in places if p["host"] == socket.gethostname()]
print(f"{len(local)} of {c.size} engines on this host, which has {node.logical_cpus} logical CPUs")
for p in local:  # an engine of this host may only run on this host's CPUs
    assert p["allowed"] is None or set(p["allowed"]) <= set(node.cpu_ids or range(node.logical_cpus)), p
    assert p["cpu"] is None or p["allowed"] is None or p["cpu"] in p["allowed"], p
    if p["allowed"] is not None and hasattr(os, "sched_getaffinity"):  # not pinned: the kernel's CPUs
        assert set(p["allowed"]) == os.sched_getaffinity(0), (p, os.sched_getaffinity(0))
print("PASS: every engine on this host may run on every CPU this kernel may (none is pinned)")

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
# stated bounds: a round trip through the controller costs milliseconds (above 0.05 ms, below
# 0.1 s even on a busy machine); no link on one host is faster than memory (~10 GB/s here)
assert 5e-5 < latency < 0.1 and 1e6 < bandwidth < 1e11, (latency, bandwidth)
print("PASS: the relative-error fit misses the measured sizes by less (rms) than the unweighted one; "
      "l and bw are within the stated bounds")

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
