"""The timing experiment returns consistent shapes, and predictions from the model."""

import numpy as np
import pytest

from coursekit import costmodel, measure
from coursekit.collectives import timing
from coursekit.collectives.timing import (TimingConfig, compare_algorithms, measure_and_predict,
                                          time_collective)
from coursekit.comm import run_local
from coursekit.cluster.runner import LocalRunner


def test_time_collective_per_rank():
    out = run_local(time_collective, 3, "allreduce", "ring", 1024, 4)
    assert len(out) == 3 and all(t.shape == (4,) and (t > 0).all() for t in out)


def test_measure_matches_model_for_predictions():
    config = TimingConfig("allgather", "ring", [64, 4096], repeats=2)
    res = measure_and_predict(LocalRunner(4), config, costmodel.LinkFit(1e-5, 1e-9))
    assert res.config == config and res.p == 4  # workers=None: every rank of the runner
    assert (res.collective, res.algorithm) == ("allgather", "ring")
    assert res.nbytes.tolist() == [64, 4096]
    assert res.measured.shape == (2,) and (res.measured > 0).all()
    np.testing.assert_allclose(res.predicted, costmodel.predict("allgather", "ring", 4,
                                                                res.nbytes, 1e-5, 1e-9))
    np.testing.assert_allclose(res.busbw_measured, res.nbytes / res.measured * 3 / 4)


def test_compare_algorithms_predicts_each_and_measures_all():
    algorithms = ("ring", "recursive_doubling", "rabenseifner")
    res = compare_algorithms(LocalRunner(4), "allreduce", algorithms, [64, 4096],
                             costmodel.LinkFit(1e-5, 1e-9), repeats=2, workers=2)
    assert list(res) == list(algorithms)
    for alg, t in res.items():
        assert t.config == TimingConfig("allreduce", alg, (64, 4096), 2) and t.p == 2
        assert t.measured.shape == (2,) and (t.measured > 0).all()
        np.testing.assert_allclose(t.predicted, costmodel.predict("allreduce", alg, 2, [64, 4096],
                                                                  1e-5, 1e-9))


def test_algorithms_are_timed_in_interleaved_rounds(monkeypatch):
    """Round by round, one call of each algorithm: a burst of load slows all alike."""
    calls = []

    def recording_allreduce(comm, data, algorithm, **kw):
        if comm.rank == 0:
            calls.append(algorithm)
        comm.barrier()

    monkeypatch.setitem(timing.FUNCTIONS, "allreduce", recording_allreduce)
    out = run_local(timing.time_algorithms, 2, "allreduce", ("ring", "recursive_doubling"), 64, 3)
    assert [t.shape for t in out] == [(3, 2)] * 2
    assert calls == ["ring", "recursive_doubling"] * 3


def test_measure_on_fewer_workers_predicts_for_them():
    res = measure_and_predict(LocalRunner(4), TimingConfig("allreduce", "ring", [4096], 1),
                              costmodel.LinkFit(1e-5, 1e-9), workers=2)
    assert res.p == 2
    np.testing.assert_allclose(res.predicted, costmodel.predict("allreduce", "ring", 2, [4096],
                                                                1e-5, 1e-9))


def test_measure_rejects_unknown_algorithm():
    with pytest.raises(ValueError, match="allowed"):
        TimingConfig("bcast", "ring", [64])


@pytest.mark.parametrize("kwargs, error, message", [
    ({"collective": "allsum"}, ValueError, "allowed: .*'allreduce'"),
    ({"algorithm": "tree"}, ValueError, "allowed: .*'ring'"),
    ({"collective": None}, TypeError, "collective must be a str.*allowed: .*'allreduce'"),
    ({"algorithm": ["ring"]}, TypeError, "algorithm must be a str.*allowed: .*'ring'"),
    ({"sizes": "1024"}, TypeError, "sizes must be a sequence"),
    ({"sizes": 1024}, TypeError, "sizes must be a sequence"),
    ({"sizes": [1024, 2.5]}, TypeError, "sizes must be an integer"),
    ({"sizes": [1024, 0]}, ValueError, "sizes=0: must be >= 1"),
    ({"sizes": []}, ValueError, "sizes is empty"),
    ({"repeats": 2.0}, TypeError, "repeats must be an integer"),
    ({"repeats": True}, TypeError, "repeats must be an integer"),
    ({"repeats": 0}, ValueError, "repeats=0: must be >= 1"),
])
def test_config_rejects_bad_settings(kwargs, error, message):
    settings = {"collective": "allreduce", "algorithm": "ring", "sizes": [64], **kwargs}
    with pytest.raises(error, match=message):
        TimingConfig(**settings)


def test_config_is_frozen_with_sizes_as_a_tuple():
    config = TimingConfig("allreduce", "ring", np.array([64, 128]))
    assert config.sizes == (64, 128) and all(type(s) is int for s in config.sizes)
    with pytest.raises(AttributeError):
        config.repeats = 3


def never_called(*args, **kwargs):
    raise AssertionError("a rank started before the arguments were checked")


@pytest.mark.parametrize("workers, error, message", [
    (5, ValueError, r"workers=5 but LocalRunner\(4\) has 4 ranks"),
    (0, ValueError, r"workers=0: must be >= 1"),
    (2.0, TypeError, r"workers must be an integer"),
])
def test_measure_refuses_bad_workers_before_any_rank_runs(monkeypatch, workers, error, message):
    runner = LocalRunner(4)
    monkeypatch.setattr(runner, "run", never_called)
    with pytest.raises(error, match=message):
        measure_and_predict(runner, TimingConfig("allreduce", "ring", [64]),
                            costmodel.LinkFit(1e-5, 1e-9), workers=workers)


@pytest.mark.parametrize("config, link, error, message", [
    (("allreduce", "ring", [64]), costmodel.LinkFit(1e-5, 1e-9), TypeError, "config must be a TimingConfig"),
    (TimingConfig("allreduce", "ring", [64]), (1e-5, 1e-9), TypeError, r"link must have \.alpha"),
    (TimingConfig("allreduce", "ring", [64]), costmodel.LinkFit(float("nan"), 1e-9), ValueError,
     "link.alpha=nan"),
    (TimingConfig("allreduce", "ring", [64]), costmodel.LinkFit(1e-5, "1e-9"), TypeError,
     "link.beta must be a real number"),
])
def test_measure_refuses_bad_config_or_link_before_any_rank_runs(monkeypatch, config, link, error,
                                                                 message):
    runner = LocalRunner(2)
    monkeypatch.setattr(runner, "run", never_called)
    with pytest.raises(error, match=message):
        measure_and_predict(runner, config, link)


def test_measure_takes_a_measured_link():
    runner = LocalRunner(2)
    link = measure.link(runner, sizes=[8, 4096], repeats=1)
    res = measure_and_predict(runner, TimingConfig("bcast", "binomial", [4096], 1), link)
    np.testing.assert_allclose(res.predicted, costmodel.predict("bcast", "binomial", 2, [4096],
                                                                link.alpha, link.beta))
