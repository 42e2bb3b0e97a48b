"""Checks for exercise 06: top-k sparsification with error feedback.

The student writes ``topk_ef_exchange(comm, grad, residual, ratio) -> (mean, new_residual)``:
x = grad + residual, send the k = max(1, round(ratio * n)) entries of x of largest
magnitude (int32 indices + values, with :func:`coursekit.collectives.allgather`), keep the
rest as the new residual, return the mean over ranks of what was sent. The check grades:

* the residual: what this rank sent, sent = x - new_residual, is exactly x on its k
  largest-magnitude entries and zero elsewhere, and sum(sent) + residual = sum(gradients)
  over several steps;
* the mean: (1/p) * sum over ranks of sent, the same on every rank;
* the bytes, from the ranks' traces: a ring allgather of k int32 indices and k values
  makes the p ranks send p(p-1) k (4 + itemsize) bytes in all, nothing more;
* convergence: 2 workers training on digits at 99% sparsity reach, in the same number of
  epochs, within 1 percentage point of uncompressed training.
"""

from __future__ import annotations

import numpy as np

from coursekit.comm import run_local
from coursekit.comm.trace import recording
from coursekit.grading.core import CheckFailure, check
from coursekit.parallel.compression import Exchanged
from coursekit.parallel.compression.experiment import CompressionConfig, train
from coursekit.parallel.compression.sparsification import keep_count
from coursekit.cluster.runner import LocalRunner

TIMEOUT = 5.0
STEPS = 4
CASES = ((1, 40, 0.1), (2, 50, 0.1), (3, 137, 0.05), (4, 64, 0.25))  # (p, n, ratio)
EPOCHS = 10


def _grads(p, n, seed):
    rng = np.random.default_rng([seed, p, n])
    return [[rng.standard_normal(n) for _ in range(STEPS)] for _ in range(p)]


def _steps(fn, p, n, ratio, grads):
    """Run STEPS exchanges on p ranks; per rank: [(x, mean, new_residual)], bytes sent."""
    def body(comm):
        residual, out = np.zeros(n), []
        with recording(comm) as messages:
            for g in grads[comm.rank]:
                x = g + residual
                result = fn(comm, g.copy(), residual.copy(), ratio)
                try:
                    mean, residual = (np.asarray(v, dtype=np.float64) for v in result)
                except (TypeError, ValueError):
                    raise CheckFailure("topk_ef_exchange must return two arrays (mean, "
                                       f"new_residual); got {result!r}") from None
                out.append((x, mean, residual))
            return out, sum(m.nbytes for m in messages() if m.op == "send")
    return run_local(body, p, timeout=TIMEOUT)


def _check_case(fn, p, n, ratio, seed):
    k = keep_count(n, ratio)
    case = f"for p={p} ranks, n={n} float64, ratio={ratio} (k={k})"
    grads = _grads(p, n, seed)
    results = _steps(fn, p, n, ratio, grads)
    for step in range(STEPS):
        sent = []
        for rank, (log, _) in enumerate(results):
            x, mean, residual = log[step]
            if mean.shape != (n,) or residual.shape != (n,):
                raise CheckFailure(f"{case}: rank {rank} returned shapes {mean.shape} and "
                                   f"{residual.shape}; both must be ({n},) like grad")
            s = x - residual
            top = np.argsort(-np.abs(x), kind="stable")[:k]
            expected = np.zeros(n)
            expected[top] = x[top]
            if not np.allclose(s, expected, rtol=0, atol=1e-12):
                raise CheckFailure(f"{case}, step {step + 1}: on rank {rank}, x - new_residual "
                                   "(what you sent) should be x = grad + residual on its k "
                                   "largest |x| entries and 0 elsewhere: the new residual keeps "
                                   "exactly what was not sent")
            sent.append(s)
        want = np.mean(sent, axis=0)
        for rank, (log, _) in enumerate(results):
            if not np.allclose(log[step][1], want, rtol=1e-12, atol=1e-12):
                raise CheckFailure(f"{case}, step {step + 1}: rank {rank}'s mean differs from "
                                   "(1/p) * the sum over ranks of what they sent (did you "
                                   "add the values at repeated indices? np.add.at does)")
    for rank, (log, _) in enumerate(results):
        total_sent = sum(x - r for x, _, r in log)
        if not np.allclose(total_sent + log[-1][2], np.sum(grads[rank], axis=0), atol=1e-10):
            raise CheckFailure(f"{case}: on rank {rank}, sum(sent) + residual != sum(grads)")
    traced = sum(b for _, b in results)
    expected_bytes = p * (p - 1) * STEPS * k * (4 + 8)
    if traced != expected_bytes:
        raise CheckFailure(f"{case}: the ranks sent {traced} bytes in {STEPS} steps; allgathers "
                           f"of k int32 indices and k float64 values send p(p-1) k (4 + 8) = "
                           f"{expected_bytes // STEPS} bytes per step in all "
                           f"({expected_bytes} for {STEPS} steps): send only the top-k, "
                           "as int32 indices, with the default (ring) allgather")


def student_exchanger(fn, ratio):
    """An ``exchanger`` for :func:`~coursekit.parallel.compression.experiment.train` that
    runs the student's function with its own residual on every rank."""
    def factory(comm, config, mlp):
        residual = np.zeros_like(mlp.params)
        k = keep_count(mlp.n_params, ratio)

        def step(grad):
            nonlocal residual
            x = grad + residual
            mean, residual = fn(comm, grad, residual, ratio)
            payload = k * (4 + grad.itemsize)
            return Exchanged(np.asarray(mean, grad.dtype), x - residual, payload,
                             (comm.size - 1) * payload)
        return step
    return factory


@check("topk_error_feedback")
def check_topk_error_feedback(topk_ef_exchange, seed: int = 0):
    """``topk_ef_exchange(comm, grad, residual, ratio) -> (mean, new_residual)``."""
    for p, n, ratio in CASES:
        _check_case(topk_ef_exchange, p, n, ratio, seed)
    dense = train(LocalRunner(2), CompressionConfig(epochs=EPOCHS, seed=seed),
                  timeout=60).final_accuracy
    sparse = train(LocalRunner(2), CompressionConfig("topk", 0.01, True, epochs=EPOCHS, seed=seed),
                   timeout=60, exchanger=student_exchanger(topk_ef_exchange, 0.01)).final_accuracy
    if sparse < dense - 0.01:
        raise CheckFailure(f"on digits, 2 workers, {EPOCHS} epochs at 99% sparsity reached "
                           f"{sparse:.1%} test accuracy against {dense:.1%} uncompressed; with "
                           "error feedback it should be within 1 percentage point")
    return (f"residuals, means and bytes right for {len(CASES)} cases; on digits at 99% "
            "sparsity within 1 point of uncompressed accuracy")
