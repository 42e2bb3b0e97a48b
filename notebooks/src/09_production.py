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

skip_rest_without_torch()

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
        for t, c in zip(r.torch_order, r.course_order):
            assert t[:8] == c[:8] and t[8:] == c[8:][::-1]
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
# (section 7: porting and the other frameworks)

# %% [markdown]
# ## When you are done
#
# The cluster keeps running until you shut down the kernel (Kernel > Shut Down Kernel):
# its cluster stops with it, even if the kernel is killed (a watchdog, `coursekit.cluster.reaper`,
# then ends the engines). To stop it now: `c.stop()`.
