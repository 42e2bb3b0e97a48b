# %% [markdown]
# # 04 · Parameter server and asynchronous SGD
#
# In chapter 3 every worker waited for every other at every step. A **parameter server**
# (PS) makes the waiting a choice. It holds the weights; workers
#
# 1. **pull** the weights `w` from the server,
# 2. compute a gradient `g` on their own mini-batch,
# 3. **push** `g` to the server, which applies the update rule (SGD `w ← w − lr·g`, or
#    momentum) itself.
#
# A large model does not fit one server: the flat parameter buffer is split into
# contiguous **shards**, one per server rank, and workers push and pull every shard.
# Each shard keeps a **version** (updates applied) and every worker's **clock**
# (iterations pushed). How long a worker may wait, or not, is the **consistency model**:
#
# | model | a worker at clock `c` may compute when | updates applied | staleness |
# |---|---|---|---|
# | BSP (bulk synchronous) | `min_clock ≥ c` (everyone has pushed iteration `c − 1`; SSP at `s = 0`) | mean of all `W` gradients, once per iteration | 0 |
# | SSP, bound `s` (stale synchronous) | `c − min_clock ≤ s` | mean per iteration, as soon as all have pushed it; a reader also sees its own pushed gradients (read-my-writes) | `0 … s` |
# | ASP (asynchronous, Downpour) | always | every push, the moment it arrives | unbounded |
#
# The **staleness** of a gradient is the shard's version when it is applied minus the
# version it was computed on. SSP with `s = 0` is BSP; DistBelief's **Downpour SGD** is
# ASP where workers fetch the weights every `n_fetch` steps and push their summed gradients
# every `n_push` steps. Dean et al. (2012) warm-started it by training a **single replica**
# before starting the others (and credited Adagrad for its stability); our `warmup` runs
# its first iterations synchronously on every worker instead, a simplification of ours.
#
# Our SSP is simpler than Ho et al.'s (2013). Theirs applies each additive update the
# moment it arrives: a reader is guaranteed every update up to clock `c − s − 1` plus its
# own (**read-my-writes**), and may see fresher ones. Ours keeps read-my-writes (a pull
# returns the shard's weights plus the worker's own gradients still waiting for the
# slower workers, each as its `1/W` share of the update it will join), but applies the
# others' gradients of an iteration only when the iteration is complete: a reader always
# gets the worst case the bound allows, so the staleness histograms below are an upper
# bound on what Ho et al.'s system would show.
#
# **Why shards?** Not only memory. A single server receives and sends `W·n` bytes per
# iteration (`n` the gradient's bytes), so its link is the bottleneck and its traffic grows
# with `W`. With one server shard on each of the `N` nodes (Li et al., OSDI 2014;
# BytePS), every node sends and receives `(N − 1)/N · n` for its share of the pushes and
# as much again for the pulls, `2(N − 1)/N · n` each way, like a ring allreduce, whatever
# `N` is (computed below with `costmodel.traffic`).

# %%
import matplotlib.pyplot as plt
import numpy as np

from coursekit import cluster
from coursekit.comm import setup_comm
from coursekit.data import load_digits
from coursekit.parallel.param_server import PSConfig, train
from coursekit.cluster.runner import ClusterRunner, LocalRunner
from coursekit.viz import integer_ticks, show

c = cluster.start(n=4)
setup_comm(c)
engines = ClusterRunner(c)  # the runs below train on these engines (one run on threads)
digits = load_digits()
engines

# %%
# bytes each node sends per iteration (pushes + pulls; it receives as many), costmodel.traffic
from coursekit import costmodel

n = PSConfig().n_params * 4  # this chapter's float32 gradient
for N in (2, 4, 8):
    one_server = costmodel.traffic("bcast", "linear", N, n, itemsize=4).nbytes  # server: pulls
    pushes = costmodel.traffic("reduce_scatter", "linear", N, n, itemsize=4).nbytes
    pulls = costmodel.traffic("allgather", "linear", N, n, itemsize=n // N).nbytes
    # (shards of 2410 floats split unevenly by one float: rtol)
    assert one_server.max() == (N - 1) * n and np.allclose(pushes + pulls, 2 * (N - 1) / N * n,
                                                            rtol=2e-3)
    print(f"N={N}: one server sends {one_server.max() / n:.2f} n; with a shard per node every "
          f"node sends {(pushes + pulls).max() / n:.2f} n = 2(N-1)/N n")

# %% [markdown]
# Rank 0 is the server shard, ranks 1–3 are workers (with two shards, `servers=2`: ranks
# 0–1 serve, the others work). As in chapter 3, the run's shape is an argument of `train`,
# not part of the config: `workers=3` takes one shard and three workers (leaving it out
# takes every rank that is not a server). Every worker trains an MLP 64–32–10 on its third
# of the digits.
#
# ## 1. BSP, and SSP with s = 0
#
# Both runs use the same seed; SSP's server answers a pull only when the clock gate
# allows it, BSP's server marches every worker in lockstep. With `s = 0` the gate makes
# every worker read exactly the weights BSP would give it:

# %%
common = dict(steps=150, dtype="float64")
bsp = train(engines, PSConfig(model="bsp", **common), workers=3)
ssp0 = train(engines, PSConfig(model="ssp", staleness=0, jitter=0.001, **common), workers=3)
assert np.array_equal(bsp.params, ssp0.params) and ssp0.staleness.max() == 0
assert bsp.applied == 3 * 150  # every worker's gradient of every step, applied once
np.array_equal(bsp.params, ssp0.params), int(ssp0.staleness.max()), bsp.applied

# %% tags=["nbval-ignore-output"]
print(bsp.summary())
print(f"test accuracy {bsp.accuracy(digits.X_test, digits.y_test):.3f}")
assert bsp.accuracy(digits.X_test, digits.y_test) > 0.85  # BSP is deterministic: 0.929 here

# %% [markdown]
# ## 2. Who waits? BSP against SSP when workers are unevenly slow
#
# Real workers are not equally fast: another job on the node, a garbage collection,
# a slow disk. We add a random delay to every step (exponential, mean 10 ms, drawn by
# each worker). BSP waits for the slowest worker at **every** step; SSP with `s = 3`
# lets the others run ahead up to three iterations and absorbs the bumps.
# Grey is idle (waiting for weights), blue compute, orange pushing.

# %%
from coursekit.viz.param_server import plot_runs, plot_worker_timeline

jittery = dict(steps=40, jitter=0.01)  # sleeps, larger than a busy machine's noise
bsp_j = train(engines, PSConfig(model="bsp", **jittery), workers=3)
ssp_j = train(engines, PSConfig(model="ssp", staleness=3, **jittery), workers=3)
for r in (bsp_j, ssp_j):
    plot_worker_timeline(r, title=f"{r.config.model.upper()}: {r.wall_s:.2f} s, "
                         f"idle {np.nanmean(r.idle_s) / r.wall_s:.0%} of the time")
show()

# %%
idle = {r.config.model: np.nanmean(r.idle_s) / r.wall_s for r in (bsp_j, ssp_j)}
assert idle["ssp"] < idle["bsp"], f"SSP idled {idle['ssp']:.0%} of the time, BSP {idle['bsp']:.0%}"

# %% [markdown]
# The price of SSP is staleness: a gradient can be applied up to `s` versions after the
# weights it was computed on, never more. ASP has no bound at all:

# %%
asp_j = train(engines, PSConfig(model="asp", **jittery), workers=3)
fig, axes = plt.subplots(1, 3, figsize=(10, 2.8), sharey=True, layout="constrained")
for ax, r, name in zip(axes, (bsp_j, ssp_j, asp_j), ("BSP", "SSP s=3", "ASP")):
    values, counts = np.unique(r.staleness, return_counts=True)
    ax.bar(values, counts)
    ax.set(title=name, xlabel="staleness (versions)")
    integer_ticks(ax, "xy")
axes[0].set_ylabel("applied gradients")
show()

# %%
assert all(int(r.staleness.max()) <= bound for r, bound in ((bsp_j, 0), (ssp_j, 3)))
[int(r.staleness.max()) <= bound for r, bound in ((bsp_j, 0), (ssp_j, 3))]

# %% [markdown]
# ## 3. Try it: the panel
#
# Pick a consistency model, the staleness bound, the number of workers and of server
# shards (together at most the 4 engines), a straggler (the last worker sleeps that long
# at every step) and a slow server (the last shard sleeps that long in every update it
# applies; section 6 measures what it costs). Run adds a run to the comparison: accuracy against **wall-clock
# time** (what you wait for) and against **gradients applied** (what the optimizer got),
# the staleness histogram and where each worker's time went. While it runs, the top plot
# shows each worker's accuracy live.
#
# Things to try: a 10 ms straggler with BSP, then SSP s = 2 and s = 8, then ASP; two
# server shards; ASP's accuracy per update against BSP's, but mind the learning rate
# (section 4): at the same `lr`, BSP steps by the *mean* of `W` gradients and ASP by each
# one, so per gradient ASP moves `W` times as far.

# %%
from coursekit.widgets.param_server import ParamServerPanel

panel = ParamServerPanel(cluster=c, restart=lambda: cluster.start(n=4), prepare=setup_comm)
panel

# %% tags=["nbval-ignore-output"]
panel.delay.value = 5.0
for model in ("bsp", "asp"):
    panel.model.value = model
    panel.run()  # the same as pressing Run, but this cell waits for the result
panel.status.value

# %% [markdown]
# ## 4. Downpour: fetch every n_fetch, push every n_push, after a warm-up
#
# With `n_fetch = n_push = 5` a worker talks to the server five times less often; between
# fetches it steps its own copy of the weights. The first `warmup = 20` iterations run
# synchronously on every worker (DistBelief instead trained one replica alone before
# starting the others): early gradients are large, and stale large gradients are what
# makes asynchronous training diverge.

# %%
downpour = train(engines, PSConfig(model="asp", steps=150, n_fetch=5, n_push=5, warmup=20,
                                   jitter=0.001), workers=3)
first = downpour.servers[0].staleness[:20 * 3]
assert first.max() == 0 and downpour.applied == 3 * 150  # the warm-up is synchronous
int(first.max()), downpour.applied

# %% [markdown]
# **A fair comparison needs equal step sizes.** At the same `lr`, BSP applies
# `w ← w − lr · mean(g_1 … g_W)`, while ASP (and Downpour, on the server and on its own
# copy) applies `w ← w − lr · g` for every gradient: per gradient it moves `W = 3` times
# as far. So we compare each run with its equal: BSP at `lr · W` against Downpour at
# `lr`, and Downpour at `lr / W` against BSP at `lr`.

# %%
W = 3
bsp_w = train(engines, PSConfig(model="bsp", lr=0.1 * W, **common), workers=3)
downpour_w = train(engines, PSConfig(model="asp", steps=150, n_fetch=5, n_push=5, warmup=20,
                                     jitter=0.001, lr=0.1 / W), workers=3)
acc = {name: r.accuracy(digits.X_test, digits.y_test) for name, r in
       [("BSP lr", bsp), ("BSP lr*W", bsp_w), ("Downpour lr", downpour), ("Downpour lr/W", downpour_w)]}
# at the same lr Downpour looks better; at equal steps per gradient it is no better than BSP
assert acc["Downpour lr"] > acc["BSP lr"] + 0.01, acc
assert abs(acc["Downpour lr"] - acc["BSP lr*W"]) < 0.025, acc
assert acc["Downpour lr/W"] < acc["BSP lr"] + 0.015, acc
print("test accuracy ≈" + " ".join(f"{a:.2f}" for a in acc.values()), f"({', '.join(acc)})")
print("PASS: at equal step size per gradient, Downpour does not beat BSP")

# %% tags=["nbval-ignore-output"]
plot_runs([bsp, bsp_w, downpour, downpour_w], fig=plt.figure(figsize=(10, 5), layout="constrained"))
show()

# %% [markdown]
# Downpour's edge at the same `lr` is the learning rate, not the asynchrony: at the same
# step per gradient it matches BSP within noise (`lr · W` against `lr`), or falls a little
# behind (`lr / W` against `lr`, where staleness and a warm-up at a third of BSP's step
# both cost it). What asynchrony buys is wall-clock time (section 2), not accuracy per
# gradient. Asynchrony even acts like extra momentum, about `1 − 1/W` (Mitliagkas et al.
# 2016), so explicit momentum should shrink as `W` and the staleness grow, and
# staleness-aware learning rates divide `lr` by the staleness (Zhang et al. 2016).

# %% [markdown]
# ## 5. A worker dies
#
# In synchronous training one dead worker stops everything: the server waits for its
# gradient forever (here: until `worker_timeout`, then BSP raises). Asynchronous training
# carries on. We run ASP and **worker 1 crashes** at its step 60: it stops dead and never
# talks to the server again. The server is told nothing: it notices that worker 1 has been
# silent for `worker_timeout = 1 s`, declares it lost, and the others finish, exactly as
# if its process had died. (The engine process itself lives on, so this cell is safe on a
# cluster your instructor shares with the class; on a cluster you started yourself,
# `crash_kills=True` kills the engine for real with SIGKILL, and the server sees the same.)
# The server also **checkpoints** its state every 50 updates.

# %%
from coursekit.cluster.scratch import scratch_dir

ckpt = str(scratch_dir("coursekit-ch04-"))  # the checkpoints; removed when this kernel ends
faulty = PSConfig(model="asp", steps=150, crash={1: 60}, worker_timeout=1.0,
                  jitter=0.001, checkpoint_every=50, checkpoint_dir=ckpt)
crashed = train(engines, faulty, workers=3)
assert [(d["worker"], d["clock"]) for d in crashed.lost] == [(1, 60)]
assert crashed.workers[1].status == "crashed"
[d["worker"] for d in crashed.lost], [d["clock"] for d in crashed.lost], crashed.workers[1].status

# %% tags=["nbval-ignore-output"]
print(crashed.summary())

# %% [markdown]
# The job is restarted from the last checkpoint every shard wrote, with three workers
# again (here on threads in this process, as a job scheduler would restart it on other
# machines). The server's weights, momentum,
# version and clocks come back: no update applied before the checkpoint is lost, and the
# workers carry on from the clocks the server recorded.

# %%
from coursekit.parallel.checkpoint import ShardState

saved = ShardState.latest(ckpt, 1)  # the newest version every shard (here: one) saved intact
restart = train(LocalRunner(4), PSConfig(model="asp", steps=150, resume=True,
                                         checkpoint_dir=ckpt), digits, workers=3)
assert saved % 50 == 0 and restart.servers[0].version > saved
assert [w.status for w in restart.workers] == ["finished"] * 3
saved, restart.servers[0].version > saved, [w.status for w in restart.workers]

# %% tags=["nbval-ignore-output"]
print(f"checkpoint at version {saved}; after the restart: version {restart.servers[0].version}, "
      f"test accuracy {restart.accuracy(digits.X_test, digits.y_test):.3f}")
assert restart.accuracy(digits.X_test, digits.y_test) > 0.85  # 0.958 here; ASP varies a little

# %% [markdown]
# ## 6. A server shard dies, or is slow
#
# A worker's death costs the run one worker's gradients. A **server shard's** death costs
# it a range of the weights, which exists nowhere else: even asynchronous training cannot
# go on. We run ASP with two shards (ranks 0 and 1) and two workers (ranks 2 and 3), and
# **shard 1 crashes** when its version reaches 60: it stops answering and never sends a
# report, as a dead process would (simulated: the engine lives on). Each worker waits
# `timeout = 1 s` for shard 1's weights, tells shard 0 that it leaves, and ends; `train`
# then raises `ServerFailure` naming the shard. Nothing waits longer than the timeout.

# %%
from coursekit.parallel.param_server import ServerFailure

dead_shard = PSConfig(model="asp", steps=150, server_crash={1: 60}, timeout=1.0, jitter=0.001)
try:
    train(engines, dead_shard, workers=2, servers=2)
except ServerFailure as err:
    failure = err
assert failure.shards == [1]
assert str(failure).startswith("server shard 1 (rank 1, parameters [1205, 2410)) failed")
assert "waited 1 s for shard 1" in str(failure)
print(str(failure).splitlines()[0])

# %% [markdown]
# The engines are still fine: the next run on them starts clean (the requests the
# workers sent to the silent shard were discarded with the comms).
#
# **The slowest server sets the pace.** Under BSP every worker needs every shard's weights
# before it computes, and every shard needs every worker's gradient before it updates. The
# shards update their ranges in parallel, so if shard `k` spends `d_k` extra seconds on
# each update (`server_delay`, the servers' twin of the workers' `straggler`), an
# iteration takes
#
# `T = T_0 + max_k d_k`,
#
# where `T_0` is the iteration without delays (`pace.bsp_iteration_s`). A single server
# holding every range would take `T_0 + Σ_k d_k`. We measure `T` as the median time
# between two iterations (`pace.measured_iteration_s`) with no delay, with shard 1 slowed
# by 60 ms, and with shard 0 slowed by 30 ms as well.

# %% tags=["nbval-ignore-output"]
from coursekit.parallel.param_server.pace import bsp_iteration_s, measured_iteration_s

pace = []
for delays in ({}, {1: 0.06}, {0: 0.03, 1: 0.06}):
    run = train(engines, PSConfig(model="bsp", steps=25, server_delay=delays), workers=2,
                servers=2)
    pace.append((delays, measured_iteration_s(run)))
base = pace[0][1]
for delays, T in pace:
    model = bsp_iteration_s(base, delays)
    print(f"server_delay {delays}: measured {T * 1e3:5.1f} ms per iteration, model T0 + max d "
          f"{model * 1e3:5.1f} ms, one server's T0 + sum d {(base + sum(delays.values())) * 1e3:5.1f} ms")
    # a sleep is never shorter than asked; the measured median stays within 15 ms above
    # the model (the other shards' work overlaps the delay, so it can be below T0 + max d)
    assert max(delays.values(), default=0) <= T <= model + 0.015, (delays, T, model)
# a second, faster slow shard costs (almost) nothing: the sum model is 30 ms away
assert abs(pace[2][1] - pace[1][1]) < 0.015, pace

# %% [markdown]
# Slowing a second shard by 30 ms changes the pace by less than the 15 ms bound: the
# iteration waits for the slowest shard, not for the sum. The same holds for workers
# (section 2): a synchronous step waits for its slowest participant, server or worker.

# %% [markdown]
# ## When you are done
#
# The cluster keeps running, so the panel above stays live after Run All. Shut down the
# kernel when you are done (Kernel > Shut Down Kernel): its cluster stops with it, even if
# the kernel is killed (a watchdog, `coursekit.cluster.reaper`, then ends the engines). To stop it
# now: `panel.cluster.stop()` (the panel's cluster: `c`, or a new one if you pressed
# Restart cluster).
