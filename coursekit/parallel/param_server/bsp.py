"""BSP on the parameter server, as a plain lockstep loop (the reference SSP s = 0 must equal).

Every iteration t, each shard

1. sends its weights ``w_t`` (version t) to every worker,
2. receives one gradient slice from every worker, in worker order,
3. applies ``w_{t+1} = w_t - lr * (1/W) sum_i g_i`` (or the momentum rule) on its range;

each worker receives the weights from every shard, computes its gradient, sends the slices.
No clocks, no gate, no any-source receive: nothing can be stale. The price is the lecture's:
everyone waits for the slowest worker at every step, and when one worker dies the run stops
(a RuntimeError naming it after ``worker_timeout`` seconds), where SSP and ASP carry on.
"""

from __future__ import annotations

from coursekit.comm import CommTimeout, PeerGone
from coursekit.parallel.param_server.server import ShardServer
from coursekit.parallel.param_server.protocol import FINISHED, OK, TAG_GRAD
from coursekit.parallel.param_server.results import ServerReport, WorkerReport
from coursekit.parallel.param_server.worker import Crashed, Worker


def bsp_serve(server: ShardServer) -> ServerReport:
    """A shard's lockstep loop: broadcast weights, gather gradients, update."""
    comm, config = server.comm, server.cfg
    workers = range(server.topology.workers)
    saved = comm.timeout
    comm.timeout = config.worker_timeout  # how long the slowest worker may take per step
    try:
        while server.version < config.steps:
            for w in workers:
                server.reply(w, OK)
            items = []
            for w in workers:
                grad = _gradient(server, w)
                grad = server.check_grad(w, grad, server.version + 1)
                if grad is not None:
                    items.append((w, grad, server.version))
            server.clocks[:] = server.version + 1
            server.apply(items, len(items), average=True)
    finally:
        comm.timeout = saved
    for w in workers:
        server.reply(w, FINISHED)
    return server.report()


def _gradient(server: ShardServer, w: int):
    rank = server.topology.worker_ranks[w]
    try:
        return server.comm.recv(rank, TAG_GRAD)
    except CommTimeout as exc:
        when = ("before its process exited" if isinstance(exc, PeerGone)
                else f"within {server.cfg.worker_timeout:g} s")
        raise RuntimeError(
            f"BSP: worker {w} (rank {rank}) sent no gradient for iteration {server.version} "
            f"{when}, so no shard can update: synchronous "
            "training stops when one worker fails (SSP and ASP carry on without it)") from None


def bsp_work(me: Worker) -> WorkerReport:
    """A worker's lockstep loop: receive weights, compute, send the gradient."""
    try:
        while True:
            clocks, statuses = me.receive_weights()
            if FINISHED in statuses:
                return me.report("finished")
            step = clocks[0]
            me.snapshot(step)
            me.send_grad(me.compute(step), TAG_GRAD)
    except Crashed:
        return me.report("crashed")
