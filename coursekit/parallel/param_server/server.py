"""A sharded parameter server for SSP and ASP training (BSP's lockstep loop is in ``bsp``).

Shard ``k`` (rank k) holds the range ``[lo, hi)`` of the flat weights, an optimizer on that
range (SGD: ``w <- w - lr g``; momentum: ``v <- mu v + g, w <- w - lr v``), a **version**
(updates applied) and every worker's **clock** (iterations pushed). It serves requests from
any worker (any-source receive, protocol in :mod:`.protocol`) until every worker is done
or lost:

* PUSH of iteration k under SSP (and during the warm-up): kept until every live worker
  has pushed iteration k, then the gradients are averaged in worker order and applied
  once (``version`` becomes k + 1). Under ASP: applied at once.
* PULL before iteration c: answered when the consistency gate allows it
  (``c - min_clock <= s``, see :mod:`.consistency`), at once under ASP. Under SSP the
  reply is read-my-writes (Ho et al. 2013): the shard's weights plus the worker's own
  gradients it holds for iterations not yet applied, each as its share ``-lr/W_live * g``
  of the update it will join (:meth:`ShardServer.own_view`). The other workers' pending
  gradients stay invisible: a reader sees them exactly at the bound's worst case.
* A gradient of the wrong size or dtype is rejected: logged in ``errors``, the worker's
  clock still advances (its iteration counts without it) and the others are served on.
* A worker that owes the shard a message and stays silent for ``worker_timeout`` seconds
  is declared **lost**: the gate and the averaging ignore it from then on, so the run
  finishes with the others; ``lost`` records which worker and when.
* DONE before the last clock: the worker left because another shard fell silent
  (``server_crash``); the gate and the averaging ignore it from then on, as for a lost one.
* ``server_delay[k]``: shard k sleeps that long in every update it applies (a slow server);
  ``server_crash[k] = v``: shard k stops serving, silently, once its version reaches v and
  returns no report, as a dead process would (:func:`serve`).

Invariants the tests check: every accepted gradient is applied exactly once; under SSP no
staleness exceeds s; with s = 0 the weights equal BSP's bit for bit.
"""

from __future__ import annotations

import logging
import time

import numpy as np

from coursekit.comm.trace import Trace, now
from coursekit.nn.optim import make_optimizer
from coursekit.parallel.checkpoint import ShardState
from coursekit.parallel.param_server.consistency import combined_push, ordered_mean, pull_bound, ssp_gate
from coursekit.parallel.param_server.protocol import (EVICTED, HELLO, OK, OP_NAMES, PULL, PUSH,
                                            TAG_GRAD, decode_request, recv_request, send_reply)
from coursekit.parallel.param_server import results
from coursekit.parallel.param_server.results import ServerReport

log = logging.getLogger(__name__)


class ShardServer:
    """The state and the request handlers of one shard (:func:`serve` runs its loop)."""

    def __init__(self, comm, config, topology, shard: int, gate=ssp_gate, run=None):
        self.comm, self.cfg, self.topology = comm, config, topology
        self.shard, self.gate = shard, gate
        self.run = run  # the run's fingerprint, which its checkpoints record
        self.t0 = now()  # the caller resets it at the start barrier
        self.lo, self.hi = topology.ranges(config.n_params)[shard]
        n = topology.workers
        self.params = config.initial_params()[self.lo:self.hi].copy()
        self.opt = make_optimizer(self.params, config.lr, config.momentum)
        make_optimizer(self.params.copy(), config.lr, config.momentum).step(
            np.zeros_like(self.params))  # compile / load the update kernel before the clock runs
        self.version = self.applied = 0
        self.delay = float(config.server_delay.get(shard, 0.0))
        self.crash_at = config.server_crash.get(shard)
        self.clocks = np.zeros(n, np.int64)
        if config.resume:
            self._restore()
        self.live, self.done = np.ones(n, bool), np.zeros(n, bool)
        self.last_heard = np.zeros(n)
        # iteration -> {worker: (grad or None, read_version)}
        self.pending: dict[int, dict[int, tuple]] = {}
        self.deferred: dict[int, int] = {}  # worker -> clock of its waiting pull
        # the newest results.MAX_RECORDS of each, and the histogram of every staleness
        self.staleness, self.from_worker, self.update_t = (
            Trace(maxlen=results.MAX_RECORDS) for _ in range(3))
        self.staleness_counts: dict[int, int] = {}
        self.errors, self.lost, self.checkpoints = [], [], []

    def _restore(self) -> None:
        cfg, topology = self.cfg, self.topology
        ranges = topology.ranges(cfg.n_params)
        velocity = hasattr(self.opt, "velocity")

        def like(shard: int) -> dict:  # what every shard's file must hold in this run
            lo, hi = ranges[shard]
            size = np.empty(hi - lo, self.params.dtype)
            return {"lo": lo, "hi": hi, "params": size, "velocity": size if velocity else None,
                    "clocks": self.clocks}

        state = ShardState.load(cfg.checkpoint_dir, self.shard, topology.servers, self.run, like)
        self.params[...] = state.params
        if velocity:
            self.opt.velocity[...] = state.velocity
        self.version, self.applied = state.version, state.applied
        # BSP / SSP checkpoints are taken between iterations: every worker restarts at the
        # version; ASP workers restart where this shard last heard from them.
        self.clocks[...] = state.clocks if cfg.model == "asp" else state.version

    def elapsed(self) -> float:
        return now() - self.t0

    def log_error(self, message: str) -> None:
        message = f"shard {self.shard} at t={self.elapsed():.3f} s: {message}"
        self.errors.append(message)
        log.warning(message)

    # ---- requests ---------------------------------------------------------------------------
    def handle(self, head: np.ndarray) -> None:
        try:
            req = decode_request(head, self.topology.worker_ranks)
        except ValueError as exc:
            self.log_error(f"dropped a malformed request: {exc}")
            return
        w = req.worker_rank - self.topology.servers
        self.last_heard[w] = self.elapsed()
        if not self.live[w]:
            if req.op == PUSH:
                self.comm.recv(req.worker_rank, TAG_GRAD)  # drain its gradient
            elif req.op == PULL:
                self.reply(w, EVICTED)
            self.log_error(f"ignored a {OP_NAMES[req.op]} from worker {w}, which was declared lost")
        elif req.op == PUSH:
            self._on_push(w, req)
        elif req.op == PULL:
            if req.clock == HELLO:
                self.reply(w, OK)
            else:
                self.deferred[w] = req.clock
        elif req.clock < self.cfg.steps:  # DONE early: another shard fell silent
            self.live[w] = False
            self.log_error(f"worker {w} left at clock {req.clock}: another shard stopped answering")
            self._advance()
        else:  # DONE
            self.done[w] = True

    def _on_push(self, w: int, req) -> None:
        grad = self.comm.recv(req.worker_rank, TAG_GRAD)
        if req.n_steps < 1 or req.clock != self.clocks[w] + req.n_steps:
            self.log_error(f"ignored a push from worker {w} claiming clock {req.clock} after "
                      f"{req.n_steps} step(s); its clock here is {self.clocks[w]}")
            return
        grad = self.check_grad(w, grad, req.clock)
        self.clocks[w] = req.clock
        if combined_push(self.cfg.model, self.cfg.warmup, req.clock):
            self.pending.setdefault(req.clock - 1, {})[w] = (grad, req.read_version)
            self._advance()
        elif grad is not None:
            self.apply([(w, grad, req.read_version)], req.n_steps, average=False)

    def check_grad(self, w: int, grad: np.ndarray, clock: int) -> np.ndarray | None:
        """``grad`` if it fits this shard, else None (the rejection is logged)."""
        want = (self.hi - self.lo,)
        if grad.dtype == self.params.dtype and grad.shape == want:
            return grad
        self.log_error(f"rejected the gradient worker {w} pushed for clock {clock}: expected "
                       f"{self.params.dtype}{want} (parameters [{self.lo}, {self.hi})), got "
                       f"{grad.dtype}{grad.shape}")
        return None

    def _advance(self) -> None:
        """Apply every complete iteration: all live workers have pushed it."""
        while self.version in self.pending and np.all(self.clocks[self.live] > self.version):
            got = self.pending.pop(self.version)
            items = [(w, g, r) for w, (g, r) in sorted(got.items()) if g is not None]
            self.apply(items, len(items), average=True)

    def apply(self, items: list, n_steps: int, average: bool) -> None:
        if items:
            grads = [g for _, g, _ in items]
            self.opt.step(ordered_mean(grads) if average else grads[0])
        if self.delay:
            time.sleep(self.delay)  # a slow server (config.server_delay)
        for w, _, read_version in items:
            stale = self.version - read_version
            self.staleness.append(stale)
            self.staleness_counts[stale] = self.staleness_counts.get(stale, 0) + 1
            self.from_worker.append(w)
        self.version += 1
        self.applied += n_steps
        self.update_t.append(self.elapsed())
        every = self.cfg.checkpoint_every
        if every and self.version % every == 0:
            self.checkpoints.append(str(self.state().save(self.cfg.checkpoint_dir)))

    def own_view(self, w: int) -> np.ndarray:
        """The weights worker ``w`` reads: read-my-writes (Ho et al. 2013).

        Its own gradients of iterations this shard has not applied yet (they wait for the
        slower workers in ``pending``) are added as the share each will have in its
        iteration's averaged update, ``w - lr/W_live * sum_k g_w(k)`` (the SGD term; with
        momentum the velocity's later echo of them is not previewed). With nothing pending
        (BSP, SSP with s = 0, ASP) this is ``params`` itself, so SSP at s = 0 stays BSP bit
        for bit."""
        mine = [got[w][0] for k, got in sorted(self.pending.items())
                if k >= self.version and w in got and got[w][0] is not None]
        if not mine:
            return self.params
        total = mine[0].copy()
        for g in mine[1:]:
            total += g
        total *= self.params.dtype.type(self.cfg.lr / max(int(self.live.sum()), 1))
        return self.params - total

    def reply(self, w: int, status: int) -> None:
        send_reply(self.comm, self.topology.worker_ranks[w], self.version, self.applied,
                   int(self.clocks[w]), status, self.own_view(w))
        self.last_heard[w] = self.elapsed()

    # ---- gate, failures, end ------------------------------------------------------------------
    def release(self) -> None:
        """Answer every deferred pull whose gate is open."""
        cfg = self.cfg
        for w, clock in list(self.deferred.items()):
            bound = pull_bound(cfg.model, cfg.staleness, cfg.warmup, clock)
            if bound is None or self.gate(clock, self.clocks[self.live].copy(), bound):
                del self.deferred[w]
                self.reply(w, OK)

    def check_lost(self) -> None:
        t = self.elapsed()
        owing = self.live & ~self.done & (t - self.last_heard > self.cfg.worker_timeout)
        newly = [w for w in np.flatnonzero(owing) if w not in self.deferred]
        for w in newly:
            self.live[w] = False
            self.lost.append((int(w), t, int(self.clocks[w])))
            self.log_error(f"worker {w} (rank {self.topology.worker_ranks[w]}) sent nothing for "
                      f"{self.cfg.worker_timeout:g} s at clock {self.clocks[w]}: declared lost")
        if newly:
            self._advance()

    def check_deadlock(self) -> None:
        waiting = np.flatnonzero(self.live & ~self.done)
        if len(waiting) and all(w in self.deferred for w in waiting):
            clocks = {int(w): int(self.clocks[w]) for w in waiting}
            raise RuntimeError(
                f"shard {self.shard}: deadlock: every live worker waits at the clock gate and the "
                f"gate lets none through (pull clocks {self.deferred}, pushed clocks {clocks}, "
                f"staleness {self.cfg.staleness}); the slowest worker, at clock == min(clocks), "
                "must always be allowed to proceed")

    def finished(self) -> bool:
        return bool(np.all(self.done | ~self.live))

    def state(self) -> ShardState:
        velocity = getattr(self.opt, "velocity", None)
        return ShardState(
            self.shard, self.topology.servers, self.lo, self.hi, self.params.copy(),
            None if velocity is None else velocity.copy(), self.version, self.applied,
            self.clocks.copy(), self.run)

    def report(self) -> ServerReport:
        return ServerReport(self.shard, self.lo, self.hi, self.params.copy(), self.version,
                            self.applied, np.array(self.staleness, np.int64),
                            np.array(self.from_worker, np.int64), np.array(self.update_t),
                            self.errors, self.lost, self.checkpoints,
                            dict(sorted(self.staleness_counts.items())),
                            self.staleness.dropped, self.update_t.dropped)


def serve(server: ShardServer) -> ServerReport | None:
    """Run the SSP / ASP request loop of ``server`` until every worker is done or lost; None
    if the shard crashed (``server_crash``: it fell silent at that version)."""
    poll = min(0.05, server.cfg.worker_timeout / 4)
    while not server.finished():
        if server.crash_at is not None and server.version >= server.crash_at:
            log.warning("shard %d crashed at version %d (simulated)", server.shard, server.version)
            return None
        head = recv_request(server.comm, poll)
        if head is not None:
            server.handle(head)
        server.check_lost()
        server.release()
        server.check_deadlock()
    return server.report()
