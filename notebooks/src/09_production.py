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
# (section 1: MPI)

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
