"""Bad input gets a clear ValueError / TypeError naming what is allowed."""

import numpy as np
import pytest

from coursekit.parallel.compression import (QSGD, ErrorFeedback, PowerSGD, RandomK, Sign,
                                            Threshold, TopK, Uniform, exchange, make_compressor)
from coursekit.parallel.compression.experiment import CompressionConfig


@pytest.mark.parametrize("ratio", [0, -0.1, 1.5, float("nan")])
def test_ratio_outside_zero_one(ratio):
    for make in (TopK, lambda r: RandomK(r, rng=0)):
        with pytest.raises(ValueError, match=r"ratio=.*\(0, 1\]"):
            make(ratio)


def test_ratio_of_the_wrong_type():
    with pytest.raises(TypeError, match=r"ratio must be a real number in \(0, 1\]"):
        TopK("0.1")


@pytest.mark.parametrize("bits", [0, 1, 17, 64])
def test_bits_outside_the_supported_range(bits):
    with pytest.raises(ValueError, match=r"bits=.*: must be in \[2, 16\]"):
        Uniform(bits)


def test_bits_and_levels_must_be_ints():
    with pytest.raises(TypeError, match=r"bits must be an integer in \[2, 16\]"):
        Uniform(4.5)
    with pytest.raises(ValueError, match=r"levels=0: must be in \[1, 32767\]"):
        QSGD(0, rng=0)


def test_rank_larger_than_the_matrix_allows():
    with pytest.raises(ValueError, match=r"rank=6 is larger than a 10 x 5 matrix allows"):
        PowerSGD(6).compress(np.ones((10, 5), np.float32))
    with pytest.raises(ValueError, match=r"rank=11 is larger than a 64 x 10 matrix"):
        PowerSGD.for_mlp([64, 10], rank=11)
    with pytest.raises(ValueError, match=r"rank=0: must be in \[1, 1048576\]"):
        PowerSGD(0)


def test_powersgd_needs_a_matrix():
    with pytest.raises(ValueError, match="PowerSGD needs a 2-D gradient"):
        PowerSGD(1).compress(np.ones(10, np.float32))
    with pytest.raises(ValueError, match="reach element 640 but the gradient has only 10"):
        PowerSGD.for_mlp([64, 10], 1).compress(np.ones(10, np.float32))


@pytest.mark.parametrize("bad", [np.arange(5), np.ones(5, np.complex64), np.ones(5, bool),
                                 np.ones(5, np.float16)])
def test_non_float_gradients(bad):
    for c in (TopK(0.5), Sign(), Uniform(8), PowerSGD(1)):
        with pytest.raises(TypeError, match="gradients must be float32 or float64"):
            c.compress(bad)


def test_not_an_array_empty_or_not_finite():
    with pytest.raises(TypeError, match="must be a NumPy array"):
        TopK().compress([1.0, 2.0])
    with pytest.raises(ValueError, match="empty"):
        TopK().compress(np.ones(0, np.float32))
    with pytest.raises(ValueError, match="NaN or infinite"):
        Sign().compress(np.array([1.0, np.nan]))


def test_stochastic_compressors_need_a_generator():
    with pytest.raises(TypeError, match="rng must be a np.random.Generator or an int seed"):
        QSGD(4, rng="seed")
    with pytest.raises(TypeError):
        RandomK(0.1)  # rng is a required keyword


def test_threshold_must_be_positive():
    with pytest.raises(ValueError, match="threshold=0"):
        Threshold(0)
    with pytest.raises(TypeError, match="threshold must be a real number > 0"):
        Threshold(None)


def test_make_compressor_errors():
    with pytest.raises(ValueError, match="unknown compressor 'zip'; allowed: none, fp16"):
        make_compressor("zip")
    with pytest.raises(ValueError, match="'sign' takes no parameter"):
        make_compressor("sign", 0.1)
    with pytest.raises(ValueError, match="powersgd needs the MLP's layer sizes"):
        make_compressor("powersgd", 2)


def test_exchange_and_memory_errors():
    from coursekit.comm import ThreadComm
    comm = ThreadComm.world(1)[0]
    with pytest.raises(TypeError, match="is not a compressor"):
        exchange(comm, np.ones(4, np.float32), "topk")
    ef = ErrorFeedback()
    ef.update(np.ones(4), np.zeros(4))
    with pytest.raises(ValueError, match="does not match the residual"):
        ef.compensate(np.ones(5))


def test_setup_errors():
    with pytest.raises(ValueError, match="unknown compressor"):
        CompressionConfig("gzip")
    with pytest.raises(ValueError, match="epochs=0"):
        CompressionConfig(epochs=0)
    with pytest.raises(ValueError, match=r"ratio=2.0"):
        CompressionConfig("topk", 2.0)
    with pytest.raises(ValueError, match="rank=100 is larger than a 64 x 64 matrix"):
        CompressionConfig("powersgd", 100)
