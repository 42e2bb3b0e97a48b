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
# (section 4: ZeRO and FSDP)

# %% [markdown]
# ## 5. torch.distributed.pipelining beside chapter 5's schedules
# (section 5: pipelining)

# %% [markdown]
# ## 6. DDP's PowerSGD hook beside chapter 6's PowerSGD
# (section 6: PowerSGD)

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
# ## When you are done
#
# The cluster keeps running until you shut down the kernel (Kernel > Shut Down Kernel):
# its cluster stops with it, even if the kernel is killed (a watchdog, `coursekit.cluster.reaper`,
# then ends the engines). To stop it now: `c.stop()`.
