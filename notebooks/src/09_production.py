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
# - **Shared memory between ranks on one host.** MPICH passes a small message through a
#   shared-memory cell that the receiver polls: no socket, no system call, no Python, a few
#   microseconds. Above 8 KiB it copies once, straight from the sender's memory (CMA,
#   `process_vm_readv`). For bcast and small allreduces it can skip messages altogether:
#   the ranks of a node write into one shared buffer and wait on flags in it (its
#   `release_gather` algorithms). The course's MpiComm reaches MPI's point-to-point
#   transport through Python (a header per message, a poll loop that yields the core);
#   ZmqComm goes through loopback TCP, single copy only from 256 KiB (chapter 2, section 1).
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
# ends.

# %%
def sum_of_ranks(comm):
    import torch
    import torch.distributed as dist
    from coursekit.production.torch_group import process_group
    with process_group(comm):
        x = torch.tensor([float(comm.rank)], dtype=torch.float64)
        dist.all_reduce(x)
        return dist.get_rank(), dist.get_world_size(), dist.get_backend(), float(x[0])

groups = engines.run(sum_of_ranks)
assert [g[:2] for g in groups] == [(r, engines.size) for r in range(engines.size)], groups
assert all(g[3] == sum(range(engines.size)) for g in groups), groups
groups

# %% [markdown]
# ## 3. DDP beside chapter 3's synchronous allreduce SGD
# (section 3: DDP)

# %% [markdown]
# ## 4. ZeroRedundancyOptimizer and FSDP beside chapter 8's ZeRO
# (section 4: ZeRO and FSDP)

# %% [markdown]
# ## 5. torch.distributed.pipelining beside chapter 5's schedules
# (section 5: pipelining)

# %% [markdown]
# ## 6. DDP's PowerSGD hook beside chapter 6's PowerSGD
# (section 6: PowerSGD)

# %% [markdown]
# ## 7. Porting chapter 3's training script to DDP
# (section 7: porting and the other frameworks)

# %% [markdown]
# ## When you are done
#
# The cluster keeps running until you shut down the kernel (Kernel > Shut Down Kernel):
# its cluster stops with it, even if the kernel is killed (a watchdog, `coursekit.cluster.reaper`,
# then ends the engines). To stop it now: `c.stop()`.
