"""coursekit.cluster.runner: one way to run fn(comm, ...) on k ranks, in this process or on engines."""

import pytest
from ipyparallel import interactive  # engines get these test functions by value

from coursekit.comm import setup_comm
from coursekit.cluster.runner import ClusterRunner, LocalRunner, RankFailure


@interactive
def shape(comm, tag):
    return comm.rank, comm.size, tag


@interactive
def fails_on(comm, bad_rank):
    if comm.rank == bad_rank:
        raise ValueError("bad input on purpose")
    comm.recv(source=bad_rank)  # the others wait for it and time out


@interactive
def publishes(comm, steps):
    from coursekit.cluster import live

    reporter = live.Reporter(interval=0.0)
    for step in range(1, steps + 1):
        reporter.log(step=step, total=steps, loss=float(comm.rank + step))
    reporter.close()
    return comm.rank


def test_local_runner_runs_on_the_first_k_ranks_in_rank_order():
    runner = LocalRunner(4)
    assert runner.run(shape, "x") == [(r, 4, "x") for r in range(4)]
    assert runner.run(shape, "y", ranks=2) == [(0, 2, "y"), (1, 2, "y")]


@pytest.mark.parametrize("ranks, error, words", [
    (0, ValueError, r"ranks=0: must be in \[1, 4\] \(LocalRunner\(4\) has 4\)"),
    (5, ValueError, r"ranks=5: must be in \[1, 4\]"),
    (2.0, TypeError, r"ranks must be an integer in \[1, 4\]"),
])
def test_a_bad_number_of_ranks_is_refused_before_anything_runs(ranks, error, words):
    with pytest.raises(error, match=words):
        LocalRunner(4).run(shape, "x", ranks=ranks)


@pytest.mark.parametrize("make, error, words", [
    (lambda: LocalRunner(0), ValueError, "size=0: must be >= 1"),
    (lambda: LocalRunner(2, comm_timeout=0), ValueError, "comm_timeout=0: must be > 0"),
    (lambda: LocalRunner("2"), TypeError, "size must be an integer"),
    (lambda: ClusterRunner(object()), TypeError, "cluster must be a coursekit cluster"),
    (lambda: LocalRunner(2).run("shape"), TypeError, "a runner runs a function fn"),
])
def test_bad_runner_arguments_say_what_is_allowed(make, error, words):
    with pytest.raises(error, match=words):
        make()


def test_a_local_failure_names_the_rank_that_caused_it_not_the_ones_that_waited():
    with pytest.raises(RankFailure) as failure:
        LocalRunner(3, comm_timeout=1).run(fails_on, 1)
    assert failure.value.ranks == [1]
    assert failure.value.ename == "ValueError"
    assert isinstance(failure.value.__cause__, ValueError)  # the rank's own exception
    assert "fails_on failed on rank 1:\n  rank 1: ValueError: bad input on purpose" \
        == str(failure.value)


def test_what_ranks_publish_reaches_on_update_while_the_run_goes():
    seen = []
    results = LocalRunner(2).run(publishes, 5, on_update=lambda data: seen.append(
        [d.get("loss", []) for d in data]))
    assert results == [0, 1]
    assert seen[-1] == [[1.0, 2.0, 3.0, 4.0, 5.0], [2.0, 3.0, 4.0, 5.0, 6.0]]


def test_start_returns_a_run_to_follow_later():
    run = LocalRunner(2).start(shape, "later")
    assert run.wait(30) and run.ready()
    assert run.get() == [(0, 2, "later"), (1, 2, "later")]


@interactive
def kill_self(comm):
    import os
    import signal

    if comm.rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return comm.rank


@interactive
def sleeps(comm, seconds):
    import time

    time.sleep(seconds)
    return comm.rank


@pytest.fixture
def engines(cluster3):
    setup_comm(cluster3, timeout=2)
    return ClusterRunner(cluster3, timeout=60)


def test_cluster_runner_gives_the_first_k_engines_a_comm_of_k_ranks(engines):
    assert engines.size == 3
    assert engines.run(shape, "e") == [(r, 3, "e") for r in range(3)]
    assert engines.run(shape, "two", ranks=2) == [(0, 2, "two"), (1, 2, "two")]
    seen = []
    assert engines.run(publishes, 4, on_update=seen.append) == [0, 1, 2]
    assert [d["loss"] for d in seen[-1]] == [[r + s for s in range(1, 5)] for r in range(3)]


def test_a_failure_on_an_engine_is_the_same_rank_failure_as_in_this_process(engines):
    with pytest.raises(RankFailure) as failure:
        engines.run(fails_on, 2)
    assert failure.value.ranks == [2] and failure.value.ename == "ValueError"
    assert "rank 2: ValueError: bad input on purpose" in str(failure.value)
    assert "rank 0: CommTimeout" in str(failure.value)  # the knock-on, listed, not blamed
    engines.reset_comms()


def test_a_run_timeout_stops_the_busy_ranks(start_cluster):
    c = start_cluster(n=3)  # its engines get interrupted: not a shared cluster
    setup_comm(c, timeout=2)
    engines = ClusterRunner(c, timeout=60)
    with pytest.raises(TimeoutError, match="did not finish within 0.5 s"):
        engines.run(sleeps, 30, ranks=2, timeout=0.5)
    assert engines.run(shape, "after", timeout=20)[0] == (0, 3, "after")  # interrupted: free


def test_a_rank_allowed_to_die_yields_none_and_one_not_allowed_fails_the_run(start_cluster):
    for n, may_die in ((3, [1]), (2, [])):
        c = start_cluster(n=n)
        setup_comm(c, timeout=2)
        runner = ClusterRunner(c, timeout=60)
        if may_die:
            assert runner.run(kill_self, ranks=2, may_die=may_die) == [0, None]
        else:
            with pytest.raises(RankFailure, match="rank 1: EngineError: its engine process died"):
                runner.run(kill_self)


@pytest.mark.parametrize("workers, error, message", [
    (5, ValueError, r"workers=5 but LocalRunner\(4\) has 4 ranks"),
    (0, ValueError, r"workers=0: must be >= 1 \(the number of workers\)"),
    (True, TypeError, r"workers must be an integer >= 1"),
])
def test_check_workers_refuses_what_the_runner_cannot_run(workers, error, message):
    with pytest.raises(error, match=message):
        LocalRunner(4).check_workers(workers)


def test_check_workers_defaults_to_every_rank():
    assert LocalRunner(3).check_workers(None) == 3 and LocalRunner(3).check_workers(2) == 2


def test_a_rank_that_only_lost_its_peer_is_listed_not_blamed():
    """A CommTimeout or a PeerGone (its peer's process ended) is a knock-on of another
    rank's failure: listed in the message, not among the ranks that stopped the run."""
    failure = RankFailure("train_worker", {
        0: ("CommTimeout", "rank 0: recv(source=2, tag=1) timed out after 3 s waiting for rank 2"),
        1: ("EngineError", "its engine process died while running the task"),
        2: ("PeerGone", "rank 2: recv(source=1, tag=1) stopped waiting for rank 1 (tag 1): its "
                        "process has exited")})
    assert failure.ranks == [1] and failure.ename == "EngineError"
    assert str(failure).startswith("train_worker failed on rank 1:\n")
    assert "rank 2: PeerGone: recv(source=1, tag=1) stopped waiting for rank 1" in str(failure)
