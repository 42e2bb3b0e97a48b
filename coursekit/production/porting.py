"""Porting chapter 3's training script to DDP: two real scripts, run on the same engines.

:data:`CHAPTER3_SCRIPT` trains the course's MLP (as torch layers, :mod:`.torch_mlp`) the
chapter-3 way: every rank computes the gradient of its rows of each batch, then sums the
weighted gradients g = sum_k (n_k / B) g_k with the course's ring ``allreduce`` over the
course Comm. :data:`DDP_SCRIPT` is the same file after the smallest port to
``DistributedDataParallel``: open torch's process group, wrap the model, drop the
hand-written allreduce (DDP averages the gradients in buckets during ``backward()``), close
the group. :func:`port_diff` is the unified diff between them.

:func:`run_script` runs one on every rank the way ``torchrun`` would start it: with the
environment ``torchrun`` sets (MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK, WORLD_SIZE; rank
0's address and a free port of it, told to the others over the course Comm), and
``comm``, ``X``, ``y`` defined. A script leaves its result in ``params`` (the course's flat
layout).
"""

from __future__ import annotations

import difflib
import socket

import numpy as np

from .torch_group import environment, interface_of, own_address, share_address

__all__ = ["CHAPTER3_SCRIPT", "DDP_SCRIPT", "port_diff", "run_script", "torchrun_env"]

CHAPTER3_SCRIPT = '''\
import numpy as np
import torch
from coursekit.collectives import allreduce
from coursekit.nn import MLP
from coursekit.parallel.data_parallel.sampler import Sampler
from coursekit.production.torch_mlp import flat_params, to_torch

rank, world = comm.rank, comm.size
model = to_torch(MLP((64, 32, 10), dtype=np.float64, seed=0))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
sampler = Sampler(len(X), 64, seed=0)
for step in range(5):
    rows, weight = sampler.local(step, rank, world)
    optimizer.zero_grad()
    logits = model(torch.from_numpy(X[rows]))
    loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(y[rows]))
    loss.backward()
    for p in model.parameters():  # g = sum_k (n_k / B) g_k
        p.grad.copy_(torch.from_numpy(allreduce(comm, p.grad.numpy() * weight)))
    optimizer.step()
params = flat_params(model)
'''

DDP_SCRIPT = '''\
import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from coursekit.nn import MLP
from coursekit.parallel.data_parallel.sampler import Sampler
from coursekit.production.torch_mlp import flat_params, to_torch

dist.init_process_group("gloo")  # torchrun set MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE
rank, world = dist.get_rank(), dist.get_world_size()
model = DDP(to_torch(MLP((64, 32, 10), dtype=np.float64, seed=0)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
sampler = Sampler(len(X), 64, seed=0)
for step in range(5):
    rows, weight = sampler.local(step, rank, world)
    optimizer.zero_grad()
    logits = model(torch.from_numpy(X[rows]))
    loss = torch.nn.functional.cross_entropy(logits, torch.from_numpy(y[rows]))
    loss.backward()  # DDP averages the gradients, bucket by bucket, during the backward
    optimizer.step()
params = flat_params(model.module)
del model  # DDP goes before its process group
dist.destroy_process_group()
'''



def port_diff(before: str = CHAPTER3_SCRIPT, after: str = DDP_SCRIPT) -> str:
    """The unified diff of the port (``difflib``), as ``git diff`` would show it."""
    return "".join(difflib.unified_diff(before.splitlines(True), after.splitlines(True),
                                        "train_ch03.py", "train_ddp.py", n=1))


def torchrun_env(comm):
    """The environment ``torchrun`` gives each rank, while the block runs (call on every
    rank): rank 0's address and a free port of it, RANK and WORLD_SIZE of ``comm``, and
    the interface gloo is to use (as on a cluster: ``GLOO_SOCKET_IFNAME``)."""
    own = own_address(comm)
    port = 0
    if comm.rank == 0:
        with socket.socket() as probe:  # a port free now; init_process_group binds it
            probe.bind((own, 0))
            port = probe.getsockname()[1]
    host, port = share_address(comm, own, port)
    return environment(MASTER_ADDR=host, MASTER_PORT=str(port), RANK=str(comm.rank),
                       LOCAL_RANK=str(comm.rank), WORLD_SIZE=str(comm.size),
                       GLOO_SOCKET_IFNAME=interface_of(own))


def run_script(comm, source: str, X, y) -> np.ndarray:
    """Run ``source`` on this rank as ``torchrun`` would, with ``comm``, ``X``, ``y``
    defined; return the ``params`` it leaves."""
    namespace = {"comm": comm, "X": X, "y": y, "__name__": "__main__"}
    with torchrun_env(comm):
        exec(compile(source, "<train script>", "exec"), namespace)
    return namespace["params"]
