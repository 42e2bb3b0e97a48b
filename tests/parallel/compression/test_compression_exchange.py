"""Compressed exchange on ThreadComm ranks: the mean, the bytes on the wire (from the
trace), error feedback's invariant, PowerSGD's two rounds, and training."""

import numpy as np
import pytest

from coursekit import costmodel
from coursekit.comm import run_local
from coursekit.comm.trace import recording
from coursekit.parallel.compression import (COMPRESSORS, Compressed, ErrorFeedback, PowerSGD,
                                            Sign, TopK, bitpack, exchange, make_compressor,
                                            predict_seconds)
from coursekit.parallel.compression.experiment import CompressionConfig, train
from coursekit.cluster.runner import LocalRunner

SIZES = [16, 8, 4]  # 16*8 + 8 + 8*4 + 4 = 172 parameters
N = 172


def grads_of(rank, steps=1, dtype=np.float64):
    rng = np.random.default_rng([11, rank])
    return [rng.standard_normal(N).astype(dtype) for _ in range(steps)]


def build(name, rank, value=None):
    rng = 5 if name == "powersgd" else np.random.default_rng([3, rank])
    return make_compressor(name, value, rng=rng, sizes=SIZES)


def run_exchange(comm, name, value=None, dtype=np.float64):
    (g,) = grads_of(comm.rank, dtype=dtype)
    with recording(comm) as messages:
        out = exchange(comm, g, build(name, comm.rank, value))
        return out, sum(m.nbytes for m in messages() if m.op == "send")


@pytest.mark.parametrize("p", [1, 2, 3, 5])
@pytest.mark.parametrize("name", list(COMPRESSORS))
def test_exchange_averages_and_the_trace_counts_the_reported_bytes(name, p):
    value = 1.0 if name == "threshold" else None  # about a third of N(0,1) values pass 1.0
    results = run_local(run_exchange, p, name, value)
    outs = [o for o, _ in results]
    # every rank holds the same mean: the average of what each rank sent (signSGD: their
    # majority vote, tested below) (fp16 sums in half precision: p roundings of 2^-11
    # relative, on values below ~4)
    sent = [o.sent for o in outs]
    reference = build(name, 0).aggregate(sent) if name == "signsgd" else np.mean(sent, axis=0)
    tol = p * 4 * 2.0**-11 if name == "fp16" else 1e-9
    for o in outs:
        np.testing.assert_array_equal(o.mean, outs[0].mean)
        np.testing.assert_allclose(o.mean, reference, rtol=0, atol=tol)
    # bytes on the wire: measured from the trace == what exchange reports == the formula
    payload = [o.payload_nbytes for o in outs]
    collective = build(name, 0).collective
    for rank, (o, traced) in enumerate(results):
        assert traced == o.wire_nbytes, (rank, traced, o.wire_nbytes)
        if collective == "allgather":  # the ring forwards every payload but the right neighbour's
            expected = sum(payload) - payload[(rank + 1) % p] if p > 1 else 0
        elif collective == "allreduce":
            item = 2 if name == "fp16" else 8
            expected = costmodel.traffic("allreduce", "ring", p, payload[rank],
                                         itemsize=item).nbytes[rank]
        else:  # powersgd: P (+ biases) then Q, two ring allreduces
            first = ((16 + 8) * 2 + 8 + 4) * 8  # rank 2 on 16x8 (P 16x2) and 8x4 (P 8x2) + biases
            second = (8 + 4) * 2 * 8
            assert payload[rank] == first + second
            expected = sum(costmodel.traffic("allreduce", "ring", p, b, itemsize=8).nbytes[rank]
                           for b in (first, second))
        assert o.wire_nbytes == expected, (rank, o.wire_nbytes, expected)


@pytest.mark.parametrize("p", [2, 3, 4, 5])
def test_signsgd_steps_with_the_majority_vote_of_the_workers_signs(p):
    """Bernstein et al.'s aggregation: sign(sum of the workers' signs), one bit per element
    (a tie, possible with an even p, counts as +1), not the mean of the signs."""
    outs = [o for o, _ in run_local(run_exchange, p, "signsgd")]
    signs = np.array([np.where(grads_of(r)[0] >= 0, 1.0, -1.0) for r in range(p)])
    votes = signs.sum(axis=0)
    for rank, o in enumerate(outs):
        np.testing.assert_array_equal(o.sent, signs[rank])
        np.testing.assert_array_equal(o.mean, np.where(votes >= 0, 1.0, -1.0))
        np.testing.assert_array_equal(o.mean[votes != 0], np.sign(votes[votes != 0]))
    assert set(np.unique(outs[0].mean)) == {-1.0, 1.0}  # a 1-bit result ...
    vote = bitpack.pack_marked(outs[0].mean > 0, 1)     # ... that fits one sign payload
    assert vote.nbytes == outs[0].payload_nbytes == -(-(N + 1) // 8)
    np.testing.assert_array_equal(Sign(scaled=False).decompress(
        Compressed(vote, (N,), np.dtype(np.float64))), outs[0].mean)
    assert (np.abs(signs.mean(axis=0)) < 1).any()  # workers disagree somewhere ...
    assert not np.array_equal(outs[0].mean, signs.mean(axis=0))  # ... so it is no mean
    if p % 2 == 0:
        assert (votes == 0).any() and (outs[0].mean[votes == 0] == 1).all()
    # the signs travel by a ring allgather: (p - 1) payloads sent per rank
    assert all(o.wire_nbytes == (p - 1) * -(-(N + 1) // 8) for o in outs)


def test_scaled_sign_averages_the_decompressed_payloads():
    outs = [o for o, _ in run_local(run_exchange, 3, "sign")]
    np.testing.assert_allclose(outs[0].mean, np.mean([o.sent for o in outs], axis=0),
                               rtol=0, atol=1e-12)


def test_uncompressed_exchange_is_the_plain_mean():
    outs = run_local(run_exchange, 4, "none")
    want = np.mean([grads_of(r)[0] for r in range(4)], axis=0)
    np.testing.assert_allclose(outs[0][0].mean, want, rtol=1e-12)


def test_powersgd_at_full_rank_averages_exactly_across_ranks():
    def body(comm):
        (g,) = grads_of(comm.rank)
        return exchange(comm, g, PowerSGD.for_mlp(SIZES, rank=4, seed=2)).mean  # 8x4: full

    means = run_local(body, 3)
    want = np.mean([grads_of(r)[0] for r in range(3)], axis=0)
    np.testing.assert_allclose(means[0][-36:], want[-36:], atol=1e-12)  # W_2 (full rank), b_2
    np.testing.assert_allclose(means[0][128:136], want[128:136], atol=1e-12)  # b_1, dense


@pytest.mark.parametrize("make", [lambda r: TopK(0.05), lambda r: Sign(),
                                  lambda r: make_compressor("qsgd", 2, rng=r),
                                  lambda r: PowerSGD.for_mlp(SIZES, 1)],
                         ids=["topk", "sign", "qsgd", "powersgd"])
def test_error_feedback_keeps_sum_sent_plus_residual_equal_to_sum_of_gradients(make):
    def body(comm):
        grads = grads_of(comm.rank, steps=25)
        memory, compressor = ErrorFeedback(), make(comm.rank)
        sent = [exchange(comm, g, compressor, memory).sent for g in grads]
        return np.sum(grads, axis=0), np.sum(sent, axis=0), memory.residual

    for total_grad, total_sent, residual in run_local(body, 2):
        np.testing.assert_allclose(total_sent + residual, total_grad, rtol=0, atol=1e-10)
        assert np.abs(residual).max() > 1e-3  # compression really dropped something


def test_without_error_feedback_the_dropped_part_is_lost():
    def body(comm):
        grads = grads_of(comm.rank, steps=25)
        compressor = TopK(0.05)
        return np.sum(grads, axis=0) - np.sum([exchange(comm, g, compressor).sent
                                               for g in grads], axis=0)

    lost = run_local(body, 2)[0]
    assert np.abs(lost).max() > 1.0


def test_predict_seconds_follows_the_cost_model():
    a, b, p, n = 5e-5, 1e-9, 4, 1000
    assert predict_seconds("allgather", p, n, a, b) == pytest.approx((p - 1) * a + (p - 1) * n * b)
    assert predict_seconds("allreduce", p, n, a, b) == pytest.approx(
        2 * (p - 1) * a + 2 * (p - 1) / p * n * b)
    assert predict_seconds("powersgd", p, n, a, b) == pytest.approx(
        4 * (p - 1) * a + 2 * (p - 1) / p * n * b)
    with pytest.raises(ValueError, match="collective='bcast'"):
        predict_seconds("bcast", p, n, a, b)


# ---- training ----------------------------------------------------------------------------------

def test_training_keeps_every_rank_identical_and_counts_bytes():
    result = train(LocalRunner(3), CompressionConfig("qsgd", 4, epochs=1))
    for params in result.params[1:]:
        np.testing.assert_array_equal(params, result.params[0])
    steps = result.steps_per_epoch
    n = result.n_params
    assert result.payload_bytes[-1] == steps * (4 + -(-(n * 4 + 1) // 8))  # codes + end mark
    assert result.wire_bytes[-1] == 2 * result.payload_bytes[-1]  # ring allgather, p=3


def test_topk_99_with_error_feedback_matches_uncompressed_and_without_it_does_worse():
    """The chapter's claim on digits, 2 workers, 10 epochs, seed 0."""
    dense, ef, no_ef = (train(LocalRunner(2),
                              CompressionConfig(**kw, epochs=10, seed=0)).final_accuracy
                        for kw in (
        {}, {"compressor": "topk", "value": 0.01, "error_feedback": True},
        {"compressor": "topk", "value": 0.01}))
    assert dense > 0.93
    assert abs(dense - ef) <= 0.01
    assert no_ef < dense - 0.02


def test_sent_per_rank_in_bytes_topk_breaks_even_at_p_100():
    from coursekit.parallel.compression import TopK, sent_per_rank

    n = 40_000  # float32 elements: 160 kB
    payload = TopK(0.01).compress(np.ones(n, np.float32) + np.arange(n, dtype=np.float32)).nbytes
    assert payload == 8 * n // 100  # 4-byte index + 4-byte value per kept element
    for p in (2, 4, 64, 100, 128):
        dense = sent_per_rank("allreduce", p, 4 * n)
        assert dense == pytest.approx(2 * (p - 1) / p * 4 * n, abs=8 * p)  # about 8n bytes
        assert sent_per_rank("allgather", p, payload) == (p - 1) * payload
    assert sent_per_rank("allreduce", 4, 4 * n) / sent_per_rank("allgather", 4, payload) == 25.0
    assert sent_per_rank("allreduce", 100, 4 * n) == sent_per_rank("allgather", 100, payload)
    with pytest.raises(ValueError, match="collective='bcast'"):
        sent_per_rank("bcast", 4, 8)
