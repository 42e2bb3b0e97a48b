"""Compressors alone: shapes and dtypes, bytes, unbiasedness, exactness, bad input."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from coursekit.parallel.compression import (COMPRESSORS, FP16, QSGD, Compressed, ErrorFeedback,
                                            NoCompression, PowerSGD, RandomK, Sign, TernGrad,
                                            Threshold, TopK, Uniform, make_compressor)
from coursekit.parallel.compression import bitpack

SIZES = [64, 32, 10]  # an MLP's layer sizes: 64*32 + 32 + 32*10 + 10 = 2410 parameters
N = 2410


def grad(n=N, dtype=np.float32, seed=0):
    return np.random.default_rng(seed).standard_normal(n).astype(dtype)


def build(name, value=None, seed=0):
    rng = seed if name == "powersgd" else np.random.default_rng(seed)
    return make_compressor(name, value, rng=rng, sizes=SIZES)


# ---- every compressor round-trips shapes and dtypes ------------------------------------------

@pytest.mark.parametrize("name", list(COMPRESSORS))
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_every_compressor_round_trips_shape_and_dtype(name, dtype):
    shapes = [(N,)] if name == "powersgd" else [(N,), (10, 241), (2, 5, 241), (1,)]
    for shape in shapes:
        x = grad(int(np.prod(shape)), dtype).reshape(shape)
        c = build(name)
        payload = c.compress(x)
        y = c.decompress(payload)
        assert y.shape == x.shape and y.dtype == x.dtype, (name, shape)
        assert payload.nbytes == payload.data.nbytes > 0
        assert np.isfinite(y).all()


def test_powersgd_round_trips_a_plain_matrix():
    x = grad(12 * 7, np.float64).reshape(12, 7)
    y = PowerSGD(3).decompress(PowerSGD(3).compress(x))
    assert y.shape == x.shape and y.dtype == x.dtype


# ---- bytes: the docstrings' formulas, computed independently ---------------------------------

@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_payload_bytes_match_the_documented_formulas(dtype):
    s = np.dtype(dtype).itemsize
    x = grad(N, dtype)
    k = round(0.01 * N)
    expected = {
        "none": N * s, "fp16": 2 * N,
        # codes + end mark; qsgd's 4 levels: 9 codes, 4 bits
        "uniform": s + -(-(N * 8 + 1) // 8), "qsgd": s + -(-(N * 4 + 1) // 8),
        "terngrad": s + -(-(N * 2 + 1) // 8), "signsgd": -(-(N + 1) // 8),
        "sign": s + -(-(N + 1) // 8),
        "topk": k * (4 + s), "randomk": k * (4 + s),
        "threshold": int(np.sum(np.abs(x) >= 0.1)) * (4 + s),
        "powersgd": ((64 + 32) * 2 + (32 + 10) * 2 + 32 + 10) * s,  # (m + n) r + biases
    }
    for name in COMPRESSORS:
        assert build(name).compress(x).nbytes == expected[name], name
    assert Uniform(3).compress(x).nbytes == s + -(-(N * 3 + 1) // 8)
    assert QSGD(1, rng=0).compress(x).nbytes == s + -(-(N * 2 + 1) // 8)


# ---- unbiasedness: Monte Carlo with a tolerance from the estimator's own variance -----------

def monte_carlo(compressor, x, draws):
    samples = np.stack([compressor.decompress(compressor.compress(x)) for _ in range(draws)])
    mean, std = samples.mean(axis=0), samples.std(axis=0, ddof=1)
    return mean, std / np.sqrt(draws)


def max_z(compressor, x, draws=2000):
    """Largest |mean - x| / standard error over the coordinates. A coordinate the compressor
    sends exactly (standard error 0) must match to 1e-9 (its z is taken against 1e-9)."""
    mean, se = monte_carlo(compressor, x, draws)
    return float(np.max(np.abs(mean - x) / np.maximum(se, 1e-9)))


def away_from_zero(n=40, seed=7):
    """Entries with 0.5 <= |x_i| <= 1.5, so no coordinate is a rare event (a rounding
    probability near 0 would make the empirical standard error useless)."""
    rng = np.random.default_rng(seed)
    return rng.uniform(0.5, 1.5, n) * rng.choice([-1, 1], n)


# 40 coordinates: under unbiasedness max |z| over 40 near-normal z's exceeds 5 with
# probability ~ 40 * 5.7e-7 (a failure means a real bias, not bad luck)
UNBIASED = [lambda: QSGD(2, rng=1), lambda: QSGD(16, rng=2), lambda: TernGrad(rng=3),
            lambda: RandomK(0.25, rng=4), lambda: NoCompression()]


@pytest.mark.parametrize("make", UNBIASED, ids=["qsgd2", "qsgd16", "terngrad", "randomk", "none"])
def test_unbiased_compressors_are_unbiased(make):
    x = away_from_zero()
    c = make()
    assert c.unbiased
    assert max_z(c, x) < 5


@pytest.mark.parametrize("make", [lambda: TopK(0.25), lambda: Sign(), lambda: Uniform(2)],
                         ids=["topk", "sign", "uniform2"])
def test_the_monte_carlo_test_detects_biased_compressors(make):
    x = away_from_zero()
    c = make()
    assert not c.unbiased
    assert max_z(c, x, draws=200) > 5


def test_qsgd_variance_shrinks_with_more_levels():
    x = np.random.default_rng(0).standard_normal(200)

    def error(levels):
        c = QSGD(levels, rng=0)
        return np.mean([np.sum((c.decompress(c.compress(x)) - x) ** 2) for _ in range(50)])

    assert error(64) < error(8) < error(1)


@pytest.mark.parametrize("make", UNBIASED, ids=["qsgd2", "qsgd16", "terngrad", "randomk", "none"])
def test_measured_variance_stays_under_the_documented_bound(make):
    x = np.random.default_rng(7).standard_normal(300) ** 3  # heavy-tailed, like gradients
    c = make()
    errors = [np.sum((c.decompress(c.compress(x)) - x) ** 2) for _ in range(200)]
    assert np.mean(errors) <= 1.05 * c.variance_bound(x.size) * np.sum(x * x)


def test_biased_compressors_have_no_variance_bound():
    assert TopK(0.1).variance_bound(100) is None and Uniform(8).variance_bound(100) is None


def test_error_feedback_residual_grows_when_omega_exceeds_one():
    """Why qsgd 4 levels + EF diverged in chapter 6: e <- x - C(x) with E||x - C(x)||^2 up
    to omega ||x||^2; omega = 17 for s = 4 on 4,810 parameters, 0.54 for s = 128."""
    g = np.random.default_rng(1).standard_normal(4810)
    growth = {}
    for levels in (4, 128):
        c, memory = QSGD(levels, rng=0), ErrorFeedback()
        for _ in range(30):
            x = memory.compensate(g)
            memory.update(x, c.decompress(c.compress(x)))
        growth[levels] = np.linalg.norm(memory.residual) / np.linalg.norm(g)
    assert QSGD(4, rng=0).variance_bound(4810) > 1 > QSGD(128, rng=0).variance_bound(4810)
    assert growth[4] > 1e3 and growth[128] < 3


# ---- exact properties ----------------------------------------------------------------------

def test_fp16_is_a_cast_and_rejects_overflow():
    x = grad()
    np.testing.assert_array_equal(FP16().decompress(FP16().compress(x)),
                                  x.astype(np.float16).astype(np.float32))
    with pytest.raises(ValueError, match="fp16 cannot hold"):
        FP16().compress(np.array([1e5], np.float32))


@pytest.mark.parametrize("bits", [2, 3, 8, 16])
def test_uniform_error_is_at_most_half_a_step(bits):
    x = grad(1000, np.float64)
    levels = 2 ** (bits - 1) - 1
    y = Uniform(bits).decompress(Uniform(bits).compress(x))
    assert np.abs(y - x).max() <= np.abs(x).max() / (2 * levels) * (1 + 1e-12)


def test_topk_keeps_exactly_the_largest_magnitudes():
    signs = np.where(np.arange(100) % 2, 1, -1)
    x = np.random.default_rng(1).permutation(np.arange(1, 101) * signs).astype(np.float64)
    y = TopK(0.1).decompress(TopK(0.1).compress(x))
    kept = np.flatnonzero(y)
    np.testing.assert_array_equal(np.sort(np.abs(x[kept])), np.arange(91, 101))
    np.testing.assert_array_equal(y[kept], x[kept])


def test_threshold_keeps_exactly_the_large_elements_and_may_send_nothing():
    x = grad(500, np.float64)
    y = Threshold(1.0).decompress(Threshold(1.0).compress(x))
    np.testing.assert_array_equal(y, np.where(np.abs(x) >= 1.0, x, 0))
    empty = Threshold(100.0).compress(x)
    assert empty.nbytes == 0
    np.testing.assert_array_equal(Threshold(100.0).decompress(empty), np.zeros_like(x))


def test_sign_sends_signs_and_the_mean_magnitude():
    x = np.array([3.0, -1.0, 0.0, -2.0])
    np.testing.assert_array_equal(Sign().decompress(Sign().compress(x)), [1.5, -1.5, 1.5, -1.5])
    np.testing.assert_array_equal(Sign(scaled=False).decompress(Sign(scaled=False).compress(x)),
                                  [1, -1, 1, -1])


def test_ratio_one_topk_and_randomk_are_exact():
    x = grad()
    np.testing.assert_array_equal(TopK(1.0).decompress(TopK(1.0).compress(x)), x)
    everything = RandomK(1.0, rng=0)
    np.testing.assert_array_equal(everything.decompress(everything.compress(x)), x)


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 16), st.integers(0, 70), st.integers(0, 2**32 - 1))
def test_bitpack_round_trips(width, n, seed):
    codes = np.random.default_rng(seed).integers(0, 2 ** width, n)
    marked = bitpack.pack_marked(codes, width)
    assert marked.dtype == np.uint8 and marked.size == -(-(n * width + 1) // 8)
    bits = np.unpackbits(marked, bitorder="little")  # code i's bit j at i * width + j
    assert all(bits[i * width + j] == (c >> j) & 1 for i, c in enumerate(codes)
               for j in range(width))
    np.testing.assert_array_equal(bitpack.unpack_marked(marked, n, width), codes)


@pytest.mark.parametrize("width", [1, 2, 3])
def test_an_end_mark_tells_every_other_count_of_codes(width):
    """Whatever the count, a payload of m codes is refused where n != m are expected, also
    when both fill the same bytes (10 and 12 signs: 2 bytes)."""
    for m in range(0, 40):
        marked = bitpack.pack_marked(np.ones(m, np.uint32), width)
        for n in range(0, 40):
            if n == m:
                assert bitpack.unpack_marked(marked, n, width).tolist() == [1] * n
                continue
            with pytest.raises(ValueError, match=f"expected {n} codes.* holding {m} codes"):
                bitpack.unpack_marked(marked, n, width)


def test_sign_refuses_a_payload_of_another_number_of_signs():
    for make in (Sign, lambda: Sign(scaled=False)):
        ten = make().compress(np.linspace(-1, 1, 10))
        assert ten.nbytes == make().compress(np.linspace(-1, 1, 12)).nbytes  # same bytes
        with pytest.raises(ValueError, match="expected 12 codes .* holding 10 codes"):
            make().decompress(Compressed(ten.data, (12,), ten.dtype))


def test_level_quantizers_refuse_a_payload_of_another_number_of_codes():
    """TernGrad, QSGD and Uniform end their codes with the mark too. Pairs of counts whose
    payloads have the same bytes, mark included: 9 and 11 codes of 2 bits (TernGrad, QSGD
    with 1 level: 3 bytes), 12 and 13 of 4 bits (QSGD, 4 levels: 7), 16 and 18 of 3 bits
    (Uniform(3): 7)."""
    cases = ((lambda: TernGrad(rng=0), 9, 11), (lambda: TernGrad(rng=0), 11, 9),
             (lambda: QSGD(1, rng=0), 9, 11), (lambda: QSGD(4, rng=0), 12, 13),
             (lambda: QSGD(4, rng=0), 13, 12), (lambda: Uniform(3), 16, 18))
    for make, held, expected in cases:
        short = make().compress(np.linspace(-1, 1, held))
        assert short.nbytes == make().compress(np.linspace(-1, 1, expected)).nbytes  # same bytes
        with pytest.raises(ValueError, match=f"expected {expected} codes .* holding {held} codes"):
            make().decompress(Compressed(short.data, (expected,), short.dtype))


# ---- PowerSGD --------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(12, 5), (5, 12), (8, 8)])
def test_powersgd_at_full_rank_reconstructs_exactly(shape):
    x = grad(shape[0] * shape[1], np.float64, seed=3).reshape(shape)
    c = PowerSGD(min(shape), seed=1)
    np.testing.assert_allclose(c.decompress(c.compress(x)), x, rtol=0, atol=1e-12)


def test_powersgd_at_full_rank_reconstructs_a_rank_deficient_matrix():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((10, 2)) @ rng.standard_normal((2, 6))  # rank 2, full rank 6
    c = PowerSGD(6)
    np.testing.assert_allclose(c.decompress(c.compress(x)), x, rtol=0, atol=1e-12)


def test_powersgd_on_an_mlp_keeps_biases_and_is_exact_on_full_rank_matrices():
    x = grad(N, np.float64)
    c = PowerSGD.for_mlp(SIZES, rank=10)  # W_1 64x32: low rank; W_2 32x10: full rank
    y = c.decompress(c.compress(x))
    np.testing.assert_array_equal(y[64 * 32:64 * 32 + 32], x[64 * 32:64 * 32 + 32])  # b_1 dense
    np.testing.assert_allclose(y[-320 - 10:-10], x[-320 - 10:-10], atol=1e-12)  # W_2 full rank


def test_powersgd_warm_start_converges_to_the_best_rank_r_approximation():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((30, 20)) * np.linspace(3, 0.1, 20)  # a decaying spectrum
    u, s, vt = np.linalg.svd(x)
    best = np.linalg.norm(x - (u[:, :2] * s[:2]) @ vt[:2])  # Eckart-Young
    c = PowerSGD(2)
    errors = [np.linalg.norm(c.decompress(c.compress(x)) - x) for _ in range(30)]
    assert errors[-1] < errors[0]
    assert errors[-1] == pytest.approx(best, rel=1e-3)
