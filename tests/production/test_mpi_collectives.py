"""MPI's own collectives beside the course's (chapter 9, section 1).

Without a cluster: the config's checks, the tolerance of a sum, busbw from the formula.
On MPI engines (markers cluster and mpi): every course result equals MPI's, bit for bit
where no float is added or where p = 2, and the engines keep the Comm they had.
"""

from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest
from ipyparallel import interactive

from coursekit.cluster.runner import ClusterRunner, LocalRunner
from coursekit.collectives import ALGORITHMS
from coursekit.production import mpi_collectives as mc
from coursekit.production.mpi_collectives import MpiCollectivesConfig, experiment

BUS_FACTOR = {"allreduce": lambda p: 2 * (p - 1) / p, "bcast": lambda p: 1.0,
              "allgather": lambda p: (p - 1) / p, "reduce_scatter": lambda p: (p - 1) / p}
"""nccl-tests' bus factors (doc/PERFORMANCE.md), written out here from the definition."""


# -- the config -----------------------------------------------------------------------------
def test_default_config_compares_the_four_collectives_over_both_course_comms():
    config = MpiCollectivesConfig()
    assert config.collectives == ("allreduce", "bcast", "allgather", "reduce_scatter")
    assert config.backends == ("mpi", "zmq")
    assert config.course_algorithms("allreduce") == ("ring", "recursive_doubling", "rabenseifner")
    assert config.course_algorithms("bcast") == ("binomial", "scatter_allgather")
    assert replace(config, repeats=2).algorithms == config.algorithms  # the stored form is taken


def test_algorithms_override_only_the_collectives_they_name():
    config = MpiCollectivesConfig(collectives=["allreduce", "bcast"],
                                  algorithms={"allreduce": ["reduce_bcast"]})
    assert config.collectives == ("allreduce", "bcast")
    assert config.course_algorithms("allreduce") == ("reduce_bcast",)
    assert config.course_algorithms("bcast") == mc.COURSE_ALGORITHMS["bcast"]


def test_sizes_become_p_equal_float64_blocks_of_at_least_one_item():
    config = MpiCollectivesConfig(sizes=(1, 1024, 1000))
    assert config.items(4) == [4, 128, 124]  # 1000 B = 125 items -> 4 blocks of 31
    assert config.items(3) == [3, 126, 123]


@pytest.mark.parametrize("kwargs, error, match", [
    ({"collectives": ("allreduce", "alltoall")}, ValueError, r"unknown collective name 'alltoall'; allowed: \['allreduce'"),
    ({"collectives": "allreduce"}, TypeError, r"collectives must be a tuple"),
    ({"collectives": ()}, ValueError, r"collectives is empty"),
    ({"collectives": ("bcast", "bcast")}, ValueError, r"names one twice"),
    ({"sizes": 1024}, TypeError, r"sizes must be a sequence"),
    ({"sizes": ()}, ValueError, r"sizes is empty"),
    ({"sizes": (1024, 0)}, ValueError, r"sizes=0: must be >= 1"),
    ({"sizes": (1.5,)}, TypeError, r"sizes must be an integer"),
    ({"sizes": (1 << 62,)}, ValueError, r"more than this machine's memory"),
    ({"repeats": 0}, ValueError, r"repeats=0"),
    ({"backends": ("mpi", "tcp")}, ValueError, r"unknown course Comm backend 'tcp'"),
    ({"backends": ()}, ValueError, r"backends is empty"),
    ({"seed": -1}, ValueError, r"seed=-1"),
    ({"algorithms": ["ring"]}, TypeError, r"algorithms must be a dict"),
    ({"algorithms": {"allreduce": ("butterfly",)}}, ValueError,
     r"algorithms\['allreduce'\]: unknown algorithm name 'butterfly'"),
    ({"collectives": ("bcast",), "algorithms": {"allreduce": ("ring",)}}, ValueError,
     r"algorithms names 'allreduce', which is not among collectives"),
])
def test_bad_configs_name_the_parameter_and_what_is_allowed(kwargs, error, match):
    with pytest.raises(error, match=match):
        MpiCollectivesConfig(**kwargs)


def test_experiment_needs_a_cluster_runner_and_a_config():
    with pytest.raises(TypeError, match=r"runner must be .*ClusterRunner"):
        experiment(LocalRunner(2), MpiCollectivesConfig())
    fake = SimpleNamespace(mpi=False, size=2)
    runner = ClusterRunner.__new__(ClusterRunner)
    runner.cluster, runner.timeout = fake, 60.0
    with pytest.raises(TypeError, match=r"config must be .*MpiCollectivesConfig"):
        experiment(runner, {"sizes": (1024,)})
    with pytest.raises(ValueError, match=r"engines launched with MPI"):
        experiment(runner, MpiCollectivesConfig())
    with pytest.raises(ValueError, match=r"workers=3 but the cluster has 2 ranks"):
        experiment(runner, MpiCollectivesConfig(), workers=3)


# -- the tolerance --------------------------------------------------------------------------
class OneRankOfP:
    """The mpi4py calls _tolerance makes, as rank ``rank`` of p ranks that hold the same x."""

    def __init__(self, p, rank):
        self.p, self.rank = p, rank

    def Get_size(self):
        return self.p

    def Get_rank(self):
        return self.rank

    def Allreduce(self, x, out):
        out[...] = self.p * x


def test_a_sum_of_p_terms_may_differ_by_p_minus_1_eps_times_the_sum_of_magnitudes():
    x = np.array([1.0, -2.0, 0.5, 4.0])
    eps = np.finfo(np.float64).eps
    np.testing.assert_array_equal(mc._tolerance(OneRankOfP(4, 0), "allreduce", x),
                                  3 * eps * 4 * np.abs(x))
    # reduce-scatter: rank 1 of 2 holds the second block of the sum
    np.testing.assert_array_equal(mc._tolerance(OneRankOfP(2, 1), "reduce_scatter", x),
                                  1 * eps * 2 * np.abs(x[2:]))
    assert not mc._tolerance(OneRankOfP(4, 0), "bcast", x).any()  # a copy must be exact


def test_differences_are_counted_in_tolerances_and_any_difference_in_a_copy_is_infinite():
    tolerance = np.array([0.25, 2.0, 0.0])
    assert mc._in_tolerances(np.array([0.125, 3.0, 0.0]), tolerance) == 1.5
    assert mc._in_tolerances(np.zeros(3), tolerance) == 0.0
    assert mc._in_tolerances(np.array([0.0, 0.0, 1e-300]), tolerance) == np.inf


# -- on MPI engines -------------------------------------------------------------------------
@interactive
def engine_comm_type():
    from coursekit.comm import engine_comm
    return type(engine_comm()).__name__


@pytest.mark.mpi
def test_course_results_equal_mpis_and_busbw_follows_the_formula(start_cluster):
    pytest.importorskip("mpi4py", reason="needs the mpi extra: pip install '.[mpi]'")
    from coursekit.comm import setup_comm

    c = start_cluster(3, engines="mpi")
    setup_comm(c, backend="zmq", timeout=20)
    runner = ClusterRunner(c)
    # every course algorithm; 3 ranks: the fold of recursive doubling and Rabenseifner; 300 kB: ZmqComm's single copy
    config = MpiCollectivesConfig(sizes=(24, 300_000), repeats=2,
                                  algorithms={c: ALGORITHMS[c] for c in mc.LIBRARY})
    runs = {p: experiment(runner, config, workers=p) for p in (3, 2)}
    assert c.run(engine_comm_type) == ["ZmqComm"] * 3  # set back to what the engines had
    for p, result in runs.items():
        assert result.p == p and result.equal
        np.testing.assert_array_equal(result.nbytes, [8 * p * max(n // 8 // p, 1)
                                                      for n in config.sizes])
        assert "MPI" in result.library
        for collective in config.collectives:
            got = result.of(collective)
            assert [(m.implementation, m.transport) for m in got] == [("MPI", "MPI")] + [
                (a, t) for t in ("MpiComm", "ZmqComm") for a in config.course_algorithms(collective)]
            for m in got:
                assert (0 < m.best).all() and (m.best <= m.seconds).all()
                assert np.isfinite(m.error).all()
                np.testing.assert_allclose(
                    m.busbw, result.nbytes / m.seconds * BUS_FACTOR[collective](p))
                if collective in ("bcast", "allgather") or p == 2:  # copies; a + b == b + a
                    assert (m.error == 0).all(), (p, m.label, m.error)
                else:
                    assert (m.error <= 1).all(), (p, m.label, m.error)
    # the ring adds in another order than MPI at p = 3: the check compares real sums
    assert (runs[3].get("reduce_scatter", "ring", "MpiComm").error > 0).any()
    assert runs[3].get("allreduce", "ring", "MpiComm").label == "ring on MpiComm"
    assert runs[3].get("allreduce", "MPI").label == "MPI_Allreduce"
    with pytest.raises(KeyError, match="no measurement of bcast ring on MpiComm"):
        runs[3].get("bcast", "ring", "MpiComm")
    table = runs[2].table().splitlines()
    assert table[0] == "busbw [GB/s] on p = 2 ranks"
    assert len(table) == 2 + len(runs[2].measurements)
