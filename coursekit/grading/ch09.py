"""Check for chapter 9's exercise (09_ddp): chapter 3's training step, wrapped in DDP.

The student's ``wrap_in_ddp(model, bucket_cap_mb)`` gets a torch MLP (the same weights on
every rank, inside torch's process group) and returns it wrapped in
``DistributedDataParallel`` with buckets of ``bucket_cap_mb`` MiB and a communication
hook that averages each gradient bucket: divide ``bucket.buffer()`` by the world size p and
sum it over the ranks with ``torch.distributed.all_reduce`` (what DDP does by default).

The check trains it on engines (SGD, float64, every rank B / p rows of each batch) and
asserts, step after step as chapter 3 does:

* the parameters equal chapter 3's synchronous allreduce SGD (``train_worker``, run on the
  same engines; tolerance 1e-12) — a hook that forgets to divide by p takes p times the
  step (the check says so);
* the bytes DDP sent: every step all-reduces each of the N parameters' gradients exactly
  once (counted by wrapping ``torch.distributed.all_reduce`` while the student's model
  trains), so each rank sends 2 (p-1)/p N 8 bytes (ring formula) per step.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from coursekit.grading.core import CheckFailure, check

SIZES = (8, 6, 3)
STEPS = 3
CAPS = (25.0, 100 / 2**20)  # one bucket; buckets of >= 100 bytes (two here)
TOL = 1e-12


def _data(seed: int, rows: int):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((rows, SIZES[0])), rng.integers(0, SIZES[-1], rows)


def _student_side(comm, wrap, cfg, data):
    """On every rank, in torch's process group: the student's DDP trained for the config's
    steps; (parameters after each step, elements all-reduced in each step, what went wrong
    or None)."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from coursekit.nn import MLP
    from coursekit.parallel.data_parallel.sampler import Sampler
    from coursekit.production.torch_mlp import flat_params, to_torch

    X, y = data
    sampler, params, reduced = Sampler(len(X), cfg.batch_size, cfg.seed), [], []
    all_reduce = dist.all_reduce

    def counting(tensor, *args, **kwargs):
        reduced[-1] += tensor.numel()
        return all_reduce(tensor, *args, **kwargs)

    model = to_torch(MLP(cfg.sizes, dtype=np.float64, seed=cfg.seed))
    ddp = wrap(model, cfg.bucket_cap_mb)
    if not isinstance(ddp, DistributedDataParallel):
        return None, None, (f"wrap_in_ddp returned {type(ddp).__name__}; return "
                            "DistributedDataParallel(model, ...)")
    if ddp.bucket_bytes_cap != cfg.bucket_bytes:
        return None, None, (f"bucket_cap_mb={cfg.bucket_cap_mb:g} gives DDP buckets of "
                            f"{ddp.bucket_bytes_cap} bytes; pass bucket_cap_mb=bucket_cap_mb")
    optimizer = torch.optim.SGD(ddp.parameters(), lr=cfg.lr)
    dist.all_reduce = counting
    try:
        for step in range(cfg.steps):
            rows, _ = sampler.local(step, comm.rank, comm.size)
            reduced.append(0)
            optimizer.zero_grad()
            logits = ddp(torch.from_numpy(X[rows]))
            torch.nn.functional.cross_entropy(logits, torch.from_numpy(y[rows])).backward()
            optimizer.step()
            params.append(flat_params(model))
    finally:
        dist.all_reduce = all_reduce
    return np.stack(params), reduced, None


def _both(comm, wrap, cfg, data):
    from coursekit.production.ddp import course_steps
    from coursekit.production.torch_group import process_group
    course = course_steps(comm, cfg, data)[0]
    with process_group(comm, "gloo"):
        return course, _student_side(comm, wrap, cfg, data)


def _run(wrap, runner, seed):
    from coursekit.cluster.runner import RankFailure
    from coursekit.production.ddp import DDPConfig, ring_bytes, serial_reference
    from coursekit.production.torch_group import torch_ranks

    p = torch_ranks(runner, runner.size, "torch.nn.parallel")
    for cap in CAPS:
        cfg = DDPConfig(sizes=SIZES, steps=STEPS, batch_size=3 * p, bucket_cap_mb=cap,
                        lr=0.3, momentum=0.0, seed=seed)
        X, y = _data(seed, STEPS * cfg.batch_size)
        case = f"on p={p} engines, bucket_cap_mb={cap:.3g}"
        try:
            out = runner.run(_both, wrap, cfg, (X, y))
        except RankFailure as failure:
            if failure.ename == "NotImplementedError":
                raise NotImplementedError from None  # the stub: the check says TODO
            raise CheckFailure(f"{case}: your function raised on the engines: {failure}") from None
        for rank, (_, (params, reduced, problem)) in enumerate(out):
            if problem:
                raise CheckFailure(f"{case}: {problem}")
            if not any(reduced):
                raise CheckFailure(f"{case}: rank {rank}'s DDP sent nothing through "
                                   "torch.distributed.all_reduce; register a communication hook "
                                   "(ddp.register_comm_hook(None, hook)) that all-reduces each "
                                   "bucket.buffer()")
        course, (params, reduced, _) = out[0][0], out[0][1]
        n = course.shape[1]
        for step in range(STEPS):
            if not np.allclose(params[step], course[step], rtol=0, atol=TOL):
                forgot = serial_reference(replace(cfg, lr=cfg.lr * p), X, y)[step]
                if np.allclose(params[step], forgot, rtol=0, atol=TOL):
                    raise CheckFailure(f"{case}: after step {step + 1} your parameters moved p={p} "
                                       "times too far: the hook summed the buckets without "
                                       "dividing by the world size (bucket.buffer() / p, then "
                                       "all_reduce)")
                err = np.abs(params[step] - course[step]).max()
                raise CheckFailure(f"{case}: after step {step + 1} the parameters differ from "
                                   f"chapter 3's synchronous allreduce SGD by up to {err:.3g} "
                                   f"(tolerance {TOL:g})")
            if reduced[step] != n:
                raise CheckFailure(f"{case}: step {step + 1} all-reduced {reduced[step]} elements; "
                                   f"the model has {n} parameters, each gradient goes once")
    sent = ring_bytes(n, p)
    return (f"equal to chapter 3's step after each of {STEPS} steps (tolerance {TOL:g}), "
            f"{len(CAPS)} bucket caps; each rank sent 2(p-1)/p N 8 = {sent:.0f} bytes per step")


@check("ddp_wrap")
def check_ddp_wrap(wrap_in_ddp, runner=None, seed: int = 0):
    """``wrap_in_ddp(model, bucket_cap_mb) -> DistributedDataParallel`` with an averaging hook.

    ``runner``: the engines to run on (a ClusterRunner with at least two engines); None
    starts a cluster of two for the check and stops it afterwards."""
    if runner is not None:
        return _run(wrap_in_ddp, runner, seed)
    from coursekit import cluster
    from coursekit.cluster.runner import ClusterRunner
    from coursekit.comm import setup_comm

    with cluster.start(n=2) as c:
        setup_comm(c, timeout=30)
        return _run(wrap_in_ddp, ClusterRunner(c), seed)
