# %% [markdown]
# # 09 · From coursekit to production
#
# Every algorithm of chapters 2 to 8 was written here from scratch and checked against its
# formula and the serial reference. In practice you call a library instead: MPI's own
# collectives (`MPI_Allreduce` ...), and PyTorch's `torch.distributed` — DDP for data
# parallelism, `ZeroRedundancyOptimizer` and FSDP for ZeRO, `torch.distributed.pipelining`
# for GPipe and 1F1B, communication hooks for PowerSGD — over gloo on CPUs or NCCL on GPUs.
# This chapter runs each library call beside the course's code **on the same engines**,
# asserts that they compute the same thing step by step, and measures the time and the
# bytes of each side by side.
#
# PyTorch is the `torch` extra (`make lab` installs it). Without it the next cell says so
# in one line and the rest of the chapter is skipped.

# %%
from coursekit.production.requirement import skip_rest_without_torch

HAVE_TORCH = skip_rest_without_torch()

# %%
import numpy as np

from coursekit import cluster
from coursekit.comm import setup_comm
from coursekit.cluster.runner import ClusterRunner

c = cluster.start(n=4)
setup_comm(c, timeout=10)
engines = ClusterRunner(c)
engines

# %% [markdown]
# ## 1. MPI's own collectives beside the course's
#
# Chapter 2 built allreduce, bcast, allgather and reduce-scatter from point-to-point
# messages. MPI has each as one call: `MPI_Allreduce`, `MPI_Bcast`, `MPI_Allgather`,
# `MPI_Reduce_scatter_block`. mpi4py's capitalized methods (`comm.Allreduce(x, out)`) hand
# NumPy buffers to MPI without pickling. This section starts a second cluster whose four
# engines are MPI ranks (`engines="mpi"`: launched by `mpiexec`), on the machine this kernel
# runs on (`local=True`: even when the chapter's cluster is your instructor's), and times,
# on the same engines with the same float64 inputs and sizes:
#
# - MPI's own call (MPICH, from the `mpi` extra);
# - the course's algorithms over **MpiComm** (`setup_comm(m, backend="mpi")`: the course's
#   point-to-point messages carried by MPI);
# - the same algorithms over **ZmqComm** (`setup_comm(m, backend="zmq")`: the chapter's
#   usual transport, on the same engines).
#
# `coursekit.production.mpi_collectives.experiment(runner, MpiCollectivesConfig(...),
# workers=p)` runs it on the first p engines and switches their Comm back when it ends. A
# time is the median over 3 calls of the slowest rank's call, each after `MPI_Barrier`;
# busbw is chapter 2's bus bandwidth ($n/t$ times $2\frac{p-1}{p}$ for allreduce,
# $\frac{p-1}{p}$ for allgather and reduce-scatter, 1 for bcast).
#
# Every course result is checked against MPI's. Bcast and allgather only move bytes: they
# must be identical. Allreduce and reduce-scatter add $p$ vectors in an order each algorithm
# picks, and a sum of $p$ terms in any order is within $(p-1)\,u\sum_r |x_r|$ of the exact
# one ($u = \varepsilon/2$), so the two results must agree within
# $(p-1)\,\varepsilon\sum_r |x_r|$ per element ($\varepsilon = 2.2\cdot10^{-16}$, float64).
# With $p = 2$ there is only one addition, $a + b = b + a$ exactly: bit for bit.

# %%
import matplotlib.pyplot as plt

from coursekit.production.mpi_collectives import MpiCollectivesConfig
from coursekit.production.mpi_collectives import experiment as compare_with_mpi
from coursekit.viz import show
from coursekit.viz.production import plot_mpi_collectives

m = cluster.start(n=4, engines="mpi", local=True)  # a second cluster: four MPI ranks here
setup_comm(m, timeout=10)
mpi_engines = ClusterRunner(m)
mpi_config = MpiCollectivesConfig(sizes=(1 << 10, 1 << 20, 4 << 20), repeats=3)
mpi_runs = {p: compare_with_mpi(mpi_engines, mpi_config, workers=p) for p in (2, 4)}

assert all(run.equal for run in mpi_runs.values())
assert all((x.error == 0).all() for x in mpi_runs[2].measurements)  # p = 2: bit for bit
for run in mpi_runs.values():
    for x in run.measurements:
        if x.collective in ("bcast", "allgather"):
            assert (x.error == 0).all(), x.label
print("PASS: every course result equals MPI's: bcast and allgather bit for bit, allreduce and "
      "reduce-scatter within (p-1) eps sum|x_r| (bit for bit at p = 2)")

# %% [markdown]
# The bus bandwidth of every implementation (the time is in the result too, `x.seconds`):

# %% tags=["nbval-ignore-output"]
factor = {"allreduce": lambda p: 2 * (p - 1) / p, "bcast": lambda p: 1.0,
          "allgather": lambda p: (p - 1) / p, "reduce_scatter": lambda p: (p - 1) / p}
for p, run in mpi_runs.items():
    print(run.table(), end="\n\n")
    for x in run.measurements:  # busbw = n / t x the bus factor, from the measured times
        np.testing.assert_allclose(x.busbw, run.nbytes / x.seconds * factor[x.collective](p))
mpi_call = {x.collective: x for x in mpi_runs[2].measurements if x.library}
lead = {c: min(x.best[0] for x in mpi_runs[2].of(c) if not x.library) / mpi_call[c].best[0]
        for c in mpi_call}  # at 1 KiB on 2 ranks: the fastest course call's time / MPI's
fastest = {side: min(x.best[0] for x in mpi_runs[2].measurements if x.library == side)
           for side in (True, False)}
assert fastest[True] < fastest[False], fastest  # what load rarely flips (see below)
print(f"PASS: at 1 KiB on 2 ranks MPI's fastest call ({fastest[True] * 1e6:.0f} us) beats the "
      f"course's fastest ({fastest[False] * 1e6:.0f} us). MPI's lead per collective: "
      + ", ".join(f"{c} {v:.1f}x" for c, v in lead.items()))

# %%
plot_mpi_collectives(mpi_runs.values(), fig=plt.figure(figsize=(10, 6.2), layout="constrained"))
show()

# %% [markdown]
# What MPI does that the course does not:
#
# - **Shared memory between ranks on one host, in C.** MPICH passes a small message through a
#   shared-memory cell that the receiver polls: no socket, no system call, no Python, a few
#   microseconds. Above 8 KiB it copies once, straight from the sender's memory (CMA,
#   `process_vm_readv`). For bcast and small allreduces it can skip messages altogether:
#   the ranks of a node write into one shared buffer and wait on flags in it (its
#   `release_gather` algorithms). The course's MpiComm reaches MPI's point-to-point
#   transport through Python (a header per message, a poll loop that yields the core);
#   ZmqComm between engines of one host goes through its shared-memory lanes, in Python
#   (chapter 2, section 1), and through loopback TCP between hosts.
# - **The algorithm is chosen per call, by message size and $p$.** MPICH's allreduce uses
#   recursive doubling up to 2 KiB and Rabenseifner's reduce-scatter + allgather above
#   (`MPIR_CVAR_ALLREDUCE_SHORT_MSG_SIZE = 2048`); its bcast a binomial tree for short
#   messages or fewer than 8 ranks, a scatter + allgather otherwise. With the course you pick
#   `algorithm=` yourself, from chapter 2's crossover. (`mpivars`, installed with MPICH,
#   lists these settings and their defaults.)
# - **The reduction runs in C** on the received buffer, and nothing checks the call: MPI
#   trusts you to pass the same shapes on every rank (the course's `check=False`).
#
# What the numbers show. With **2 ranks**, one per core, MPI's calls are usually far faster
# at 1 KiB (3 to 300 times in our runs): latency is where Python and sockets cost most. But
# MPI waits by **spinning**: a rank that waits keeps its core and gives it up only now and
# then (MPICH yields every 1000 polls). When other programs compete for the cores, a rank
# can spin while the peer it waits for is not running, and a call costs milliseconds; on a
# loaded machine we saw `MPI_Allreduce` or `MPI_Allgather` at 1 KiB on 2 ranks take longer
# than the course's, even in the best of 3 calls. So the check above asserts only what load
# rarely flips: the fastest of MPI's four calls (best of 3) beats the fastest of the
# course's; the lead per collective is printed, not asserted.
# At 4 MiB both sides move the bytes with one copy and add with vectorized loops, so the
# bus bandwidth is set by memory bandwidth and the gap closes; which side is ahead there
# changes from run to run (not asserted). With **4 ranks** on this machine's 2 cores, the
# ranks compete with each other: MPI loses most of its lead at 1 KiB and some of its calls
# take as long as the course's (not asserted either: it depends on the cores and the load).
# Give every MPI rank its own core.

# %%
m.stop()  # the MPI cluster of this section; the chapter's cluster c stays

# %% [markdown]
# ## 2. torch.distributed on the course's engines
#
# `coursekit.production.torch_group.process_group(comm)` opens torch's process group on
# the ranks of a course Comm: rank *i* of the group is rank *i* of the cluster, rank 0
# opens the rendezvous store on a free port and the course Comm tells the others where;
# gloo on CPU, NCCL when every engine has a GPU. The group is destroyed when the block
# ends. The comparisons below ask for gloo whatever the engines have: the course's side
# computes in float64 on the CPU, and so does torch's.
#
# Four engines importing torch at once take several seconds on two cores; a rank that
# finished first would wait in the rendezvous. So every section first imports what it
# uses on every engine, in a run of its own (`load_torch`).

# %%
from coursekit.production.torch_group import load_torch

torch_versions = engines.run(load_torch)
assert len(set(torch_versions)) == 1, torch_versions  # one PyTorch on every engine
print(f"PyTorch {torch_versions[0].split('+')[0]} on {engines.size} engines")

# %%
def sum_of_ranks(comm):
    import torch
    import torch.distributed as dist
    from coursekit.production.torch_group import group_device, process_group
    with process_group(comm):  # gloo here; NCCL on a cluster whose engines all have a GPU
        x = torch.tensor([float(comm.rank)], dtype=torch.float64, device=group_device())
        dist.all_reduce(x)
        return dist.get_rank(), dist.get_world_size(), dist.get_backend(), float(x[0])

groups = engines.run(sum_of_ranks)
assert [g[:2] for g in groups] == [(r, engines.size) for r in range(engines.size)], groups
assert all(g[3] == sum(range(engines.size)) for g in groups), groups
groups

# %% [markdown]
# ## 3. DDP beside chapter 3's synchronous allreduce SGD
#
# Chapter 3's synchronous allreduce SGD and PyTorch's `DistributedDataParallel` (DDP) run
# here on the same engines, from the same weights (the course's `MLP` copied into
# `torch.nn.Linear` layers: torch keeps $W^T$), on the same rows of the same batches, with
# the same SGD with momentum, in float64. `coursekit.production.ddp.ddp_experiment` runs
# both and keeps the parameters after every step:
#
# - the course: each worker weights its mean gradient by $n_k/B$ and allreduces it (ring),
#   in buckets of at most the cap, cut from the end of the flat buffer;
# - DDP: each worker's mean gradient, bucket by bucket, divided by $p$ and sum-allreduced
#   by gloo. That is the same $g=\frac1p\sum_k g_k$ because every worker has $B/p$ rows
#   (DDP weighs every rank $1/p$; `ddp_experiment` refuses a batch that $p$ does not divide).
#
# The model is chapter 3's bucket model, 64-256-256-10: $N = 85\,002$ parameters, 680 kB.
# Tolerance: $10^{-12}$ on every parameter (float64; the two sides add in different orders).

# %%
from coursekit.production.ddp import DDPConfig, ddp_bucket_plan, ddp_experiment

SIZES = (64, 256, 256, 10)
ddp_runs = {(p, cap): ddp_experiment(engines, DDPConfig(sizes=SIZES, steps=5, bucket_cap_mb=cap),
                                     workers=p)
            for p in (2, 4) for cap in (0.1, 0.25, 25)}
for (p, cap), r in ddp_runs.items():
    assert (r.max_diff <= 1e-12).all(), ((p, cap), r.max_diff)          # DDP == course, every step
    assert (r.max_diff_serial <= 1e-12).all(), ((p, cap), r.max_diff_serial)  # == serial, big batch
print(f"PASS: after each of 5 steps, on 2 and 4 engines, with 3 bucket caps, DDP's {r.n_params} "
      "parameters equal the course's and serial SGD's within 1e-12")

# %% [markdown]
# **Buckets.** DDP never splits a tensor. It packs whole parameters, in the order their
# gradients become ready in the backward pass ($b_3, W_3, b_2, W_2, \dots$), into a bucket
# until the bucket holds at least `bucket_cap_mb` MiB. The course (chapter 3, `make_buckets`)
# cuts the flat buffer into slices of *at most* the cap, from its end. So the course has
# $\lceil 8N/\text{cap}\rceil$ buckets, DDP at most as many, and bigger ones. A communication
# hook (`register_comm_hook`) sees every `GradBucket` DDP sends; it records them here and then
# averages each as DDP's default hook does. In its **first** step DDP sends one bucket of
# everything: it learns the order in which gradients arrive during that backward pass and
# rebuilds its buckets before the second step.

# %%
for cap in (0.1, 0.25, 25):
    r = ddp_runs[4, cap]
    cap_bytes = DDPConfig(bucket_cap_mb=cap).bucket_bytes
    course_kB = [(hi - lo) * 8 / 1e3 for lo, hi in r.course_buckets]
    assert len(r.buckets_at(0)) == 1  # before the rebuild: one bucket
    for step in range(1, 5):  # from step 2 on: DDP's rule
        assert [b.names for b in r.buckets_at(step)] == ddp_bucket_plan(SIZES, cap)
    ddp_kB = [b.numel * 8 / 1e3 for b in r.buckets_at(1)]
    assert max(course_kB) <= cap_bytes / 1e3 and all(n >= cap_bytes / 1e3 for n in ddp_kB[:-1])
    assert len(course_kB) == -(-8 * r.n_params // cap_bytes) >= len(ddp_kB)
    print(f"cap {cap:>5} MiB: course {len(course_kB)} buckets (kB): "
          f"{' '.join(f'{n:.1f}' for n in course_kB)}")
    print(f"{'':16}DDP {len(ddp_kB)}: " + "  ".join(
        f"[{' '.join(b.names)}] {b.numel * 8 / 1e3:.1f}" for b in r.buckets_at(1)))

# %% [markdown]
# **Bytes.** Each bucket is one ring allreduce: every rank sends $2\frac{p-1}{p}\,n\cdot 8$
# bytes for a bucket of $n$ float64 values. Summed over a step's buckets that is
# $2\frac{p-1}{p}\,N\cdot 8$ on both sides, whatever the cap: buckets change the number of
# messages (and so the latency paid), not the bytes. DDP's count is from its hook's bucket
# sizes; the course's from its trace (its ranks differ by a few bytes when $p$ does not
# divide a bucket; their mean is the formula).

# %%
for (p, cap), r in ddp_runs.items():
    formula = 2 * (p - 1) / p * r.n_params * 8
    assert np.allclose(r.ddp_sent, formula, rtol=1e-12), (p, cap)
    assert np.isclose(r.course_sent.mean(), formula, rtol=1e-12), (p, cap)
    assert np.abs(r.course_sent - formula).max() <= 2 * (p - 1) * 8 * len(r.course_buckets)
for p in (2, 4):
    r = ddp_runs[p, 0.1]
    print(f"p={p}: each rank sends {r.bytes_formula / 1e3:.1f} kB per step "
          f"(course: {r.course_sent.mean() / 1e3:.1f} kB, DDP: {r.ddp_sent.mean() / 1e3:.1f} kB)")

# %% [markdown]
# **Time per step** (the slowest rank's, median over the steps; without reading the rows).
# Not asserted: two shared cores run four engines here, and one step is a few
# milliseconds. DDP launches each bucket's allreduce from an autograd hook while the backward
# pass goes on (gloo runs it on its own thread, in C++); the course overlaps too (a Python
# thread per rank), but its backward runs layer by layer in NumPy, and each ring step is a
# Python call on ZMQ sockets.

# %% tags=["nbval-ignore-output"]
print(f"{'engines':>7} {'cap MiB':>8} {'course ms':>10} {'DDP ms':>8}")
for (p, cap), r in ddp_runs.items():
    course_s, ddp_s = r.time_per_step
    print(f"{p:>7} {cap:>8} {course_s * 1e3:>10.2f} {ddp_s * 1e3:>8.2f}")

# %% [markdown]
# ## 4. ZeroRedundancyOptimizer and FSDP beside chapter 8's ZeRO
#
# `coursekit.production.zero_fsdp.zero_experiment` trains chapter 8's run (the MLP
# 64-96-64-10 in float64, seed 1; 64 rows a step split over the engines; SGD with momentum,
# lr 0.1, μ 0.9) twice on the same engines: with the course's `ZeroRank`, then with torch
# in a gloo process group, the course's initial weights copied in. Torch's SGD keeps
# momentum the course's way: v ← μv + g, w ← w − lr·v. After every step it compares all the
# weights. What maps to what:
#
# | course (chapter 8) | torch | what a rank sends per step (Ψ values, 8 bytes each) |
# |---|---|---|
# | ZeRO-1 | `DistributedDataParallel` + `ZeroRedundancyOptimizer(SGD)` | course: reduce-scatter + all-gather, 2(p−1)/p·Ψ; torch: DDP allreduces the whole gradient, 2(p−1)/p·Ψ, then each rank broadcasts the parameters it owns, (p−1)·owned |
# | ZeRO-2 | `fully_shard(Linear, reshard_after_forward=False)` | all-gather each layer once, reduce-scatter its gradient: 2(p−1)/p·Ψ |
# | ZeRO-3 | `fully_shard(Linear)` and `fully_shard(Sequential)` | all-gather for the forward, again for the backward, reduce-scatter: 3(p−1)/p·Ψ |
#
# The course's bytes come from its trace. Torch's come from the tensors of every c10d
# collective it calls (`coursekit.production.c10d_log`), counted by the same rules:
# a ring allreduce sends 2(p−1)/p·n per rank, an all-gather or a reduce-scatter (p−1)/p·n,
# and a broadcast (p−1)·n from its root.

# %%
from coursekit.production.zero_fsdp import ZeroFsdpConfig, zero_experiment

zero_runs = {(p, stage): zero_experiment(engines, ZeroFsdpConfig(workers=p, steps=12, stage=stage))
             for p in (2, engines.size) for stage in (1, 2, 3)}
for (p, stage), run in zero_runs.items():
    assert run.max_diff.shape == (12,) and (run.max_diff <= 1e-12).all(), (p, stage, run.max_diff)
    assert (run.course_sent == run.course_formula).all(), (p, stage)
    np.testing.assert_allclose(run.torch_sent, np.broadcast_to(run.torch_formula, (12, p)),
                               rtol=1e-12)
print(f"PASS: at every stage, on 2 and {engines.size} engines, torch's weights equal the "
      "course's after each of 12 steps (max |difference| <= 1e-12), and every rank sends "
      "the formula's bytes on both sides")

# %% [markdown]
# The bound 10⁻¹² is float64 rounding with a wide margin: the two sides multiply with
# different kernels and add the ranks' gradients in different orders (the largest
# difference is printed with the times below). The bytes, per rank and step:

# %%
def kB(values):
    low, high = np.min(values) / 1e3, np.max(values) / 1e3
    return f"{low:6.1f}" if high - low < 0.05 else f"{low:.1f}-{high:.1f}"

print(f"{'engines':>7} {'stage':>5} {'course':>8} {'torch':>12} {'torch / course':>15}"
      "   (kB each rank sends per step)")
for (p, stage), run in zero_runs.items():
    ratio = run.torch_sent[0].sum() / run.course_sent[0].sum()
    print(f"{p:7d} {stage:5d} {kB(run.course_sent[0]):>8} {kB(run.torch_sent[0]):>12} "
          f"{ratio:15.2f}")

for (p, stage), run in zero_runs.items():
    course, torch_bytes = run.course_sent[0].sum(), run.torch_sent[0].sum()  # all ranks
    assert course == (3 if stage == 3 else 2) * (p - 1) * run.padded_course * 8
    if stage == 1:  # DDP's allreduce + the owners' broadcasts: 3 passes of Ψ, not 2
        assert run.torch_owned.sum() == run.n_params
        assert np.isclose(torch_bytes, 3 * (p - 1) * run.n_params * 8)
    else:           # the course's passes, over FSDP's padding instead of the course's
        assert np.isclose(torch_bytes / run.padded_torch, course / run.padded_course)
owned = np.sort(zero_runs[(4, 1)].torch_owned)  # what each of 4 ranks' optimizer updates
assert (owned[-2:] == 96 * 64).all() and owned[0] < 96 * 64 / 10, owned
run = zero_runs[(4, 3)]
padding = run.padded_course - run.n_params, run.padded_torch - run.n_params
assert padding == (2, 130), padding
print("PASS: torch's ZeRO-1 sends 3 passes of the parameters where the course's sends 2; "
      "FSDP sends the course's passes of ZeRO-2 and ZeRO-3, over its own padding")

# %% [markdown]
# Four differences, all in the numbers above:
#
# - **ZeRO-1 costs torch 1.5× the bytes.** DDP does not know the optimizer is sharded, so
#   it allreduces the whole gradient (2 passes); `ZeroRedundancyOptimizer` then broadcasts
#   each updated parameter from the rank that owns it (a 3rd pass). The course
#   reduce-scatters the gradient, so each rank receives only the sum it updates, and
#   all-gathers the result: 2 passes, an allreduce with the update in the middle.
# - **Uneven owners.** `ZeroRedundancyOptimizer` gives each rank *whole* parameters, picked
#   greedily by size; the two 6144-value weight matrices go to two ranks, the small
#   parameters to the others. The owners of big matrices broadcast more (the range in the
#   torch column of stage 1). The course and FSDP cut every layer into p equal pieces.
# - **Padding.** The course pads each layer's flat block (W then b) to a multiple of p;
#   FSDP2 shards each parameter by rows and pads the rows. On 4 engines the last layer's
#   10 rows become 12: FSDP moves 130 padding values per pass, the course 2.
# - **Stage 2 is a near match.** FSDP2 with `reshard_after_forward=False` sends what ZeRO-2
#   sends, but it frees the gathered weights after the backward and gathers them again
#   before the next forward; ZeRO-2 keeps the whole weights between steps and all-gathers
#   them right after the update. Same bytes and the same step; the all-gather moves from
#   after the update to before the next forward.
#
# What a rank holds after a step, on 4 engines (kB of float64; the course's table is
# chapter 8's, torch's is counted from its tensors, FSDP's local shards):

# %%
print(f"{'stage':>5} {'side':>6} {'params':>8} {'grads':>8} {'optimizer':>10}"
      "   (kB held by each rank)")
for stage in (1, 2, 3):
    run = zero_runs[(4, stage)]
    for side, held in (("course", run.course_memory), ("torch", run.torch_memory)):
        columns = (("params", 8), ("grads", 8), ("optimizer", 10))
        print(f"{stage:5d} {side:>6} "
              + " ".join(f"{kB([m[k] for m in held]):>{w}}" for k, w in columns))
    for owned, held in zip(run.torch_owned, run.torch_memory):
        assert held["optimizer"] == owned * 8  # momentum only: no master copy in float64
        assert held["params"] == (run.n_params if stage == 1 else owned) * 8
        assert held["grads"] == held["params"]
print("PASS: torch keeps the momentum of what it updates and no master copy; FSDP keeps only "
      "its rows of the weights and gradients between steps, at stage 2 too")

# %% [markdown]
# The course's ZeRO-1 and ZeRO-2 keep a master copy of their shard beside the momentum
# (chapter 8: in mixed precision that fp32 copy exists anyway); torch updates the weights
# it owns in place. FSDP frees the gathered weights after the backward at stage 2 too, so
# between steps it holds what ZeRO-3 holds, and the whole weights only inside a step.
#
# Both sides send float64 here, 8 bytes a value. With `MixedPrecisionPolicy(param_dtype=
# torch.bfloat16)` FSDP's all-gathers carry 2-byte weights, a quarter of these bytes. The
# time per step on each side (the median over 12 steps, slowest engine), and the largest
# difference of the weights:

# %% tags=["nbval-ignore-output"]
print(f"{'engines':>7} {'stage':>5} {'course ms':>10} {'torch ms':>9} {'max |diff|':>11}   torch")
for (p, stage), run in zero_runs.items():
    print(f"{p:7d} {stage:5d} {run.course_seconds * 1e3:10.1f} {run.torch_seconds * 1e3:9.1f} "
          f"{run.max_diff.max():11.1e}   {run.torch_side}")

# %% [markdown]
# Not asserted: four engines share two cores here, so any step time can double under load.
# The model is tiny (13 098 values, 105 kB), so neither side is limited by bandwidth; a
# step is mostly fixed costs. Torch's are larger on CPU: every FSDP layer runs hooks that
# copy its shard into a flat all-gather buffer and out again, wraps its weights as DTensors
# and launches gloo collectives through its own threads; DDP adds its bucket bookkeeping
# and `ZeroRedundancyOptimizer` six broadcasts. On GPUs with NCCL and a large model, those
# costs are small against the compute and the bytes, and FSDP overlaps the all-gather of
# the next layer with the compute of this one, which the course's ZeRO does not do.

# %% [markdown]
# ## 5. torch.distributed.pipelining beside chapter 5's schedules
# Chapter 5 cut its MLP (64 inputs, seven hidden layers of 512 units, 10 classes, float64)
# into stages and ran GPipe and 1F1B with `execute`, a schedule held as data. PyTorch's
# `torch.distributed.pipelining` does the same with a `PipelineStage` per rank and a
# schedule object (`ScheduleGPipe`, `Schedule1F1B`). `pipeline_experiment` builds both on
# the same engines: $p = 4$ stages of two layers each, stage $s$ on rank $s$, the same
# initial weights, the same batch of $N = 512$ digits in $m = 8$ micro-batches, and two
# SGD steps. It compares, after every step, the gradients and the parameters of every stage.
#
# The two sides scale the loss differently but compute the same gradient. The course
# weights micro-batch $i$'s mean loss $C_i$ by $n_i/N$. Torch averages each micro-batch's
# loss and divides the summed gradient by $m$ (`scale_grads=True`). With equal
# micro-batches, $n_i = N/m$, both give
# $\partial C/\partial\theta = \frac{1}{m}\sum_i \partial C_i/\partial\theta$.
# Only the order of the additions differs, so we allow a relative error of $10^{-10}$.

# %%
from coursekit.parallel import traffic
from coursekit.production.pipelining import RTOL, PipelineConfig, pipeline_experiment

pipes = {name: pipeline_experiment(engines, PipelineConfig(name, stages=engines.size,
                                                            microbatches=8, steps=2))
         for name in ("gpipe", "1f1b")}
boundary = 512 * 512 * 8  # N rows x 512 units x 8 bytes cross each stage boundary
assert traffic.pipeline_bytes(pipes["1f1b"].config.sizes, 512, 4).tolist() == [
    boundary, 2 * boundary, 2 * boundary, boundary]
print(f"{'schedule':9}{'max relative error':>20}{'MB sent per step, ranks 0-3':>34}")
for name, r in pipes.items():
    assert r.equal and max(r.param_error.max(), r.grad_error.max()) <= RTOL, name
    np.testing.assert_allclose(r.torch_loss, r.loss, rtol=1e-12)
    assert (np.diff(r.loss) < 0).all()  # SGD lowers the batch loss on both sides
    # bytes: counted by the course's trace and from torch's P2P sends, every step
    assert (r.course_bytes == r.formula_bytes).all() and (r.torch_bytes == r.formula_bytes).all()
    mb = " ".join(f"{b / 1e6:.1f}" for b in r.formula_bytes)
    print(f"{name:9}{'< 1e-10':>20}{'course ' + mb + ' = torch':>34}")

# %% [markdown]
# Both libraries compute the same step and send the same bytes: boundary $b$ carries
# $N \cdot 512$ numbers forward and as many gradients back, so the end ranks send
# 2.1 MB and the middle ones twice that, whatever the schedule. What differs is the
# **order**. We recorded the actions each torch rank ran (by wrapping its stage's
# `forward_one_chunk` and `backward_one_chunk`) and compare them with the course's
# schedule data:

# %%
for name, r in pipes.items():
    if name == "1f1b":
        assert r.torch_order == r.course_order
        print("1f1b: torch ran the course's order on every rank")
    else:  # the same forwards; torch runs the backwards first-in first-out
        m = r.config.microbatches
        for torch_actions, course_actions in zip(r.torch_order, r.course_order):
            assert torch_actions[:m] == course_actions[:m]  # F0 ... F(m-1)
            assert torch_actions[m:] == course_actions[m:][::-1]
        print("gpipe: the same forwards on every rank, the backwards in reverse order; rank 0:")
        print("  course:", " ".join(r.course_order[0]))
        print("  torch: ", " ".join(r.torch_order[0]))
# torch also describes its schedule as data (pipeline_order, for its visualizer); its 1F1B
# description of the last rank is off by one micro-batch (torch 2.13), not what it ran
f1b = pipes["1f1b"]
assert f1b.torch_pipeline_order[:-1] == f1b.torch_order[:-1]
assert [a for a in f1b.torch_pipeline_order[-1] if a[0] == "F"] == [f"F{i}" for i in range(1, 9)]
assert [a for a in f1b.torch_order[-1] if a[0] == "F"] == [f"F{i}" for i in range(8)]
print("1f1b, last rank, described by torch:", " ".join(f1b.torch_pipeline_order[-1]))
print("1f1b, last rank, run by torch:      ", " ".join(f1b.torch_order[-1]))

# %% [markdown]
# 1F1B is the same schedule, action for action, on every rank. GPipe runs the same
# forwards, but torch's backward takes the micro-batches in the order they came
# (0 to 7), while the course's takes them last-in first-out (7 to 0). The bubble and the peak memory are the same (every
# activation is kept until the backward starts); the gradient is the same sum added in
# another order. Torch also keeps a *description* of its schedules as data
# (`pipeline_order`); for 1F1B's last rank it lists micro-batches 1 to 8 instead of 0 to 7,
# a slip in the description only: the loop that runs is right. The course's schedule is
# one list that both the simulator and the executor read, so they cannot disagree.
#
# Time per step, the slowest rank, faster of the two steps (not asserted: four engines
# share two cores here):

# %% tags=["nbval-ignore-output"]
for name, r in pipes.items():
    print(f"{name:6} course {1e3 * r.course_seconds.min():6.0f} ms   "
          f"torch {1e3 * r.torch_seconds.min():6.0f} ms per step")

# %% [markdown]
# These are one run on a shared machine, and which side wins changes between runs. Both
# do the same matrix products on the CPU (Numba kernels calling BLAS here, torch's
# kernels there) and send the same bytes, the course through its Comm (ZeroMQ), torch
# through gloo's TCP pairs; so neither has an algorithmic advantage. Torch's gains come
# with GPUs: NCCL sends between GPUs, and CUDA streams overlap the sends with compute.

# %% [markdown]
# ## 6. DDP's PowerSGD hook beside chapter 6's PowerSGD
# Chapter 6 compressed each gradient matrix $M$ ($m \times n$) to rank $r$ with one step
# of power iteration: $P = MQ$ (allreduced), $\hat P$ = orthonormal columns of $P$,
# $Q = M^T\hat P$ (allreduced), $C = \hat P Q^T$, sending $(m+n)r$ numbers instead of
# $mn$, with error feedback and $Q$ warm-started from the previous step. DDP ships the
# same algorithm as a **communication hook**: `powerSGD_hook` replaces the gradient
# allreduce of each bucket. `powersgd_experiment` trains the chapter-6 model
# (64-64-10, float64) on 4 workers with both, for 40 steps of 16 digits per worker:
#
# * torch needs `start_powerSGD_iter` $\ge 2$ (DDP rebuilds its buckets after the first
#   step); before it, both sides run a plain allreduce;
# * `min_compression_rate=1`: torch compresses a matrix only if $(m+n)r < mn$; with this
#   value that is every weight matrix and no bias, as in the course;
# * both draw the first $Q$ at random, from different generators, so the course's $Q$ is
#   copied into torch's state before its first compressed step;
# * torch orthogonalizes the warm-start $Q$ first, the course does not. $C = \hat P\hat P^T M$
#   depends only on the column space of $MQ$, which that does not change;
# * torch keeps the residual $e_w = x_w - C$ (the mean), the course $x_w - \hat P Q_w^T$
#   (its own share). They differ on each worker, but their mean over the workers is the
#   same, and PowerSGD only ever sees the mean (both allreduces are linear in $M$).
#
# So the two trainings should agree to rounding; we allow a relative error of $10^{-9}$.

# %%
import matplotlib.pyplot as plt

from coursekit.production import powersgd_hook
from coursekit.production.powersgd_hook import PowerSGDConfig, payload_bytes, powersgd_experiment
from coursekit.viz import show

psgd_cfg = PowerSGDConfig(workers=engines.size, rank=2, start_iter=2, steps=40, error_feedback=True)
psgd = powersgd_experiment(engines, psgd_cfg)
assert psgd.param_error.max() <= powersgd_hook.RTOL
np.testing.assert_allclose(psgd.torch_loss, psgd.loss, rtol=1e-9)
assert psgd.accuracy == psgd.torch_accuracy  # the same predictions on the training set
# the residuals: the same mean over the workers, not the same on each worker
assert psgd.residual_mean_error <= 1e-9 and psgd.residual_worker_error > 1e-3
assert psgd.loss[-5:].mean() < psgd.loss[:5].mean()  # it learns

fig, ax = plt.subplots(figsize=(7, 3.2))
ax.plot(np.arange(psgd_cfg.steps), psgd.loss, color="tab:blue", label="course: exchange(PowerSGD, ErrorFeedback)")
ax.plot(np.arange(psgd_cfg.steps), psgd.torch_loss, "o", color="tab:orange", markersize=3, label="torch: DDP + powerSGD_hook")
ax.axvline(psgd_cfg.start_iter - 0.5, color="grey", linestyle=":")
ax.set(xlabel="step", ylabel="training loss (mean over workers)",
       title=f"PowerSGD rank {psgd_cfg.rank} from step {psgd_cfg.start_iter}, {psgd_cfg.workers} workers")
ax.legend(loc="upper right", fontsize=8)
show()
print(f"parameters equal to a relative 1e-9 at all {psgd_cfg.steps} steps; "
      f"training accuracy equal: {psgd.accuracy == psgd.torch_accuracy}")

# %% [markdown]
# The two curves are one. The bytes: each worker hands $8\,(n_{params})$ bytes to the
# allreduce without compression and $8\,(\sum (m+n)r + \text{biases})$ with PowerSGD,
# counted on both sides (the course's payloads; the tensors torch passes to
# `dist.all_reduce`, in three calls: biases, $P$s, $Q$s, where the course sends two: $P$s
# with the biases, then $Q$s). A ring allreduce of $b$ bytes sends $2(p-1)/p\cdot b$ per
# rank: the course's trace counts it; gloo's wire is not visible to us, so torch's column
# is that formula.

# %%
dense, low = payload_bytes(psgd_cfg, compressed=False), payload_bytes(psgd_cfg)
assert dense == 8 * (64 * 64 + 64 * 10 + 74) and low == 8 * ((64 + 64) * 2 + (64 + 10) * 2 + 74)
compressed = psgd_cfg.steps - psgd_cfg.start_iter
assert psgd.torch_allreduces.tolist() == [1] * psgd_cfg.start_iter + [3] * compressed  # biases, Ps, Qs
assert psgd.course_payload.tolist() == psgd.torch_payload.tolist() == [dense] * psgd_cfg.start_iter + [low] * compressed
# the p ranks of a ring allreduce send 2(p-1) x the payload in all: the trace's total, exactly
assert (psgd.course_wire.sum(axis=1) == 2 * (psgd_cfg.workers - 1) * psgd.course_payload).all()
print(f"{'bytes per worker per step':28}{'to allreduce':>14}{'sent, course (trace)':>22}{'sent, torch (ring)':>20}")
for label, t in (("plain allreduce", 0), (f"PowerSGD rank {psgd_cfg.rank}", psgd_cfg.steps - 1)):
    print(f"{label:28}{psgd.course_payload[t]:14,.0f}{psgd.course_wire[t].mean():22,.0f}"
          f"{psgd.ring_wire[t]:20,.0f}")
print(f"compression: {dense / low:.1f}x fewer bytes")

# %% [markdown]
# Time per step, median of the compressed steps, the slowest worker (not asserted: four
# engines share two cores):

# %% tags=["nbval-ignore-output"]
compressed_steps = slice(psgd_cfg.start_iter, None)
print(f"course {1e3 * np.median(psgd.course_seconds[compressed_steps]):.1f} ms, "
      f"torch {1e3 * np.median(psgd.torch_seconds[compressed_steps]):.1f} ms per step")

# %% [markdown]
# On a model this small a step is mostly fixed costs, not bytes: the course's Numba
# gradient and two allreduces through its Comm, against torch's autograd, DDP's bucket
# and three gloo allreduces, each a chain of futures. Which costs more depends on the
# machine. Compression pays only when the bytes dominate: large matrices on a slow
# network, the case chapter 6's cost model showed.

# %% [markdown]
# ## 7. Porting chapter 3's training script to DDP
#
# A PyTorch script written the chapter-3 way (each rank sums the weighted gradients with the
# course's ring `allreduce`) becomes a DDP script with a handful of changed lines:
# open torch's process group (`torchrun` sets its address, rank and world size in the
# environment), wrap the model in `DDP`, delete the hand-written allreduce, close the group.
# Both files below are real: `coursekit.production.porting.run_script` runs each on every
# engine as `torchrun` would, and the diff is made by `difflib` from the same two strings.

# %%
from coursekit.production import porting

print(porting.port_diff())

# %%
from coursekit.data import load_digits
from coursekit.production.ddp import DDPConfig, serial_reference

train_set = load_digits(dtype=np.float64)
X_train, y_train = train_set.X_train, train_set.y_train
by_hand = engines.run(porting.run_script, porting.CHAPTER3_SCRIPT, X_train, y_train)
ported = engines.run(porting.run_script, porting.DDP_SCRIPT, X_train, y_train)
serial = serial_reference(DDPConfig(sizes=(64, 32, 10), steps=5), X_train, y_train)[-1]
for run in (by_hand, ported):  # every rank ends with the same model
    assert all(np.array_equal(params, run[0]) for params in run)
assert np.abs(ported[0] - by_hand[0]).max() <= 1e-12 and np.abs(ported[0] - serial).max() <= 1e-12
print("PASS: after 5 steps on 4 engines the ported script's parameters equal the chapter-3 "
      "script's and serial SGD's within 1e-12")

# %% [markdown]
# ### The same step in the other frameworks
#
# Chapter 07's [section 11](07_at_scale.ipynb) maps each of the course's functions to the
# library calls that replace it. Here is the training step above in each framework (not
# installed here, not run), with what each adds to DDP.
#
# **Horovod** (MPI or Gloo to start, NCCL or MPI to reduce). `DistributedOptimizer` reduces the
# gradients with a ring allreduce; *tensor fusion* packs small tensors into one buffer of up
# to `HOROVOD_FUSION_THRESHOLD` bytes (DDP's buckets). Started by `horovodrun -np 4` or `mpirun`.
#
# ```python
# import horovod.torch as hvd
# hvd.init()
# optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
# hvd.broadcast_parameters(model.state_dict(), root_rank=0)
# loss.backward(); optimizer.step()      # the allreduce happens in the optimizer's hooks
# ```
#
# **DeepSpeed**. The engine wraps model and optimizer; a JSON config switches on ZeRO
# (stage 1: optimizer states sharded, 2: + gradients, 3: + parameters; chapter 8), mixed
# precision and gradient accumulation, with no change to the step. Started by `deepspeed train.py`.
#
# ```python
# import deepspeed
# config = {"train_batch_size": 64, "zero_optimization": {"stage": 2}, "bf16": {"enabled": True},
#           "optimizer": {"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}}}
# engine, optimizer, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
#                                                config=config)
# loss = engine(X).loss; engine.backward(loss); engine.step()
# ```
#
# **Megatron-LM** (Megatron Core). Splits the ranks into tensor-, pipeline- and data-parallel
# groups (chapter 5); layers are written with column/row-parallel linears, and the
# data-parallel group reduces the gradients in buckets, like DDP.
#
# ```python
# from megatron.core import parallel_state
# parallel_state.initialize_model_parallel(tensor_model_parallel_size=2,
#                                          pipeline_model_parallel_size=2)  # the rest: data parallel
# model = DistributedDataParallel(config, ddp_config, module=gpt_model)     # megatron.core's DDP
# ```
#
# **tf.distribute** (TensorFlow). A strategy replicates the model on every device or worker and
# all-reduces the gradients (NCCL or ring collectives); `MultiWorkerMirroredStrategy` reads the
# cluster from `TF_CONFIG`.
#
# ```python
# strategy = tf.distribute.MultiWorkerMirroredStrategy()
# with strategy.scope():
#     model = make_model(); model.compile(optimizer=tf.keras.optimizers.SGD(0.1, momentum=0.9),
#                                         loss="sparse_categorical_crossentropy")
# model.fit(dataset, epochs=2)    # the dataset is sharded and the gradients all-reduced per step
# ```
#
# **PyTorch Lightning on Slurm**. The `Trainer` builds DDP itself and reads the ranks from
# Slurm's environment; one `srun` task per GPU.
#
# ```python
# # job.sh: #SBATCH --nodes=2 --ntasks-per-node=4 --gpus-per-node=4, then: srun python train.py
# trainer = lightning.Trainer(strategy="ddp", accelerator="gpu", devices=4, num_nodes=2)
# trainer.fit(lit_module, train_dataloader)
# ```

# %% [markdown]
# ## 8. Try it: any comparison, any number of engines
#
# The panel runs one comparison of sections 3 to 6 on the engines you pick and reduces it
# to one row (`coursekit.production.side_by_side`): whether the two sides agreed after
# every step within that comparison's tolerance, the time of a step on the slowest rank,
# and the bytes one rank sends per step, the course's beside torch's. Every run is kept, so
# the bars compare runs. The comparisons run torch with gloo, the backend for the CPU
# float64 tensors both sides compute with; on engines with GPUs, NCCL carries GPU tensors
# (section 2), which these comparisons do not use. Times depend on the machine and its
# load (two shared cores here): the panel shows them, nothing asserts them.

# %%
from coursekit.nn import MLP
from coursekit.production.ddp import DDPConfig
from coursekit.widgets.production import ProductionPanel

panel = ProductionPanel(cluster=c, restart=lambda: cluster.start(n=4),
                        prepare=lambda new: setup_comm(new, timeout=10))
panel

# %% tags=["nbval-ignore-output"]
row = panel.run()  # the same as pressing Run: DDP on 4 engines
assert row is not None and row.equal, panel.status.value
assert panel.status.value == row.describe(), panel.status.value
n = MLP(DDPConfig().sizes).n_params  # the panel's DDP model: both sides send the ring's bytes
np.testing.assert_allclose([row.course_bytes, row.library_bytes], 2 * 3 / 4 * n * 8, rtol=1e-12)
panel.status.value

# %% [markdown]
# ## When you are done
#
# The cluster keeps running until you shut down the kernel (Kernel > Shut Down Kernel):
# its cluster stops with it, even if the kernel is killed (a watchdog, `coursekit.cluster.reaper`,
# then ends the engines). To stop it now: `c.stop()`.
