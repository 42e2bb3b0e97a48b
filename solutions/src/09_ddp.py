# %% [markdown]
# # Exercise 09 · Chapter 3's step, wrapped in DDP
#
# Chapter 3's synchronous step sums the weighted gradients of the ranks by hand:
#
# ```python
# loss.backward()
# for p in model.parameters():     # g = sum_k (n_k / B) g_k
#     p.grad.copy_(torch.from_numpy(allreduce(comm, p.grad.numpy() * weight)))
# optimizer.step()
# ```
#
# PyTorch's `DistributedDataParallel` (DDP) does this for you during `backward()`: it packs
# the gradients into buckets of at most `bucket_cap_mb` MiB (whole tensors) and hands each
# bucket, as soon as its gradients are ready, to a **communication hook**. Write
# `wrap_in_ddp(model, bucket_cap_mb)`: wrap `model` in DDP with that bucket cap and register
# a hook that averages each bucket, as DDP's default does: divide `bucket.buffer()` by the
# world size $p$ and sum it over the ranks with `torch.distributed.all_reduce`. With $B/p$
# rows on every rank, $\frac1p\sum_k g_k$ is chapter 3's $\sum_k \frac{n_k}{B} g_k$.
#
# A hook is `hook(state, bucket)` and returns a future of the averaged buffer:
# `dist.all_reduce(tensor, async_op=True).get_future().then(lambda fut: fut.value()[0])`.
#
# The check runs your function on two engines inside torch's process group, trains three
# SGD steps with two bucket caps, and asserts that the parameters equal chapter 3's
# synchronous allreduce SGD after every step, and that each step all-reduces every gradient
# once: $2\frac{p-1}{p}N\cdot 8$ bytes per rank (ring).
#
# PyTorch is the `torch` extra (`make lab` installs it).

# %%
from coursekit.grading.ch09 import check_ddp_wrap


# %%
def wrap_in_ddp(model, bucket_cap_mb):
    """``model`` in DDP, buckets of ``bucket_cap_mb`` MiB, each bucket averaged by a hook."""
    import torch.distributed as dist  # this function runs on the engines: import there
    from torch.nn.parallel import DistributedDataParallel

    # Hint: DistributedDataParallel(model, bucket_cap_mb=...), then ddp.register_comm_hook(None, hook)
    ### BEGIN SOLUTION
    ddp = DistributedDataParallel(model, bucket_cap_mb=bucket_cap_mb)

    def average(state, bucket):
        tensor = bucket.buffer().div_(dist.get_world_size())
        return dist.all_reduce(tensor, async_op=True).get_future().then(lambda fut: fut.value()[0])

    ddp.register_comm_hook(None, average)
    return ddp
    ### END SOLUTION


# %%
check_ddp_wrap(wrap_in_ddp)
