"""coursekit.cluster on real local ipyparallel clusters (and its errors without one)."""

import os
import signal
import subprocess
import sys
import time

import pytest
from ipyparallel import interactive  # ship these test functions by value

from coursekit import cluster
from coursekit.cluster.processes import cluster_processes


@interactive
def engine_environment():
    import os

    from coursekit.cluster import this_engine

    return this_engine().rank, os.environ.get("NUMBA_NUM_THREADS"), os.environ.get("OMP_NUM_THREADS")


@interactive
def fail_on_rank(bad_rank):
    from coursekit.cluster import this_engine

    if this_engine().rank == bad_rank:
        raise ValueError(f"rank {bad_rank} refuses")
    return this_engine().rank


@interactive
def sleep_then_rank(seconds):
    import time

    from coursekit.cluster import this_engine

    time.sleep(seconds)
    return this_engine().rank


@pytest.fixture
def three(cluster3):
    """The run's shared 3-engine cluster (tests/conftest.py)."""
    return cluster3


def test_ranks_sizes_and_single_threaded_engines(three):
    assert three.size == 3
    assert three.run(engine_environment) == [(r, "1", "1") for r in range(3)]
    infos = three.run(cluster.this_engine)
    assert [(i.rank, i.size, i.mpi) for i in infos] == [(r, 3, False) for r in range(3)]
    assert len({i.pid for i in infos}) == 3
    assert [(i.local_rank, i.local_size) for i in infos] == [(r, 3) for r in range(3)]  # one host


def test_rank_names_in_engine_namespace(three):
    assert three.view.pull("rank", block=True) == [0, 1, 2]
    assert three.view.pull("size", block=True) == [3, 3, 3]


def test_engine_error_names_the_rank(three):
    with pytest.raises(cluster.EngineError, match=r"rank 1: ValueError: rank 1 refuses"):
        three.run(fail_on_rank, 1)
    assert three.run(fail_on_rank, 99) == [0, 1, 2]  # engines survive it


def test_timeout_names_busy_ranks_and_interrupt_frees_them(start_cluster):
    three = start_cluster(n=3)  # its own: it interrupts the engines
    with pytest.raises(TimeoutError, match=r"sleep_then_rank did not finish within 0.5 s on ranks \[0, 1, 2\]"):
        three.run(sleep_then_rank, 60, timeout=0.5)
    three.interrupt()
    assert three.run(sleep_then_rank, 0, timeout=30) == [0, 1, 2]


@pytest.mark.cluster
def test_threads_per_engine_is_configurable():
    with cluster.start(n=1, threads_per_engine=2, engine_env={"COURSEKIT_MARK": "x"}) as c:
        assert c.run(engine_environment) == [(0, "2", "2")]
        assert c.run(os.getenv, "COURSEKIT_MARK") == ["x"]


@pytest.mark.cluster
def test_stop_with_busy_engines_leaves_no_process(ipython_dir):
    before = {p.pid for p in cluster_processes(ipython_dir)}  # other tests' clusters
    c = cluster.start(n=2)
    c.view.apply_async(sleep_then_rank, 120)  # busy engines
    time.sleep(0.3)
    ours = [p for p in cluster_processes(ipython_dir) if p.pid not in before]
    assert len(ours) >= 5  # controller + 2 engines + their nannies
    c.stop()
    assert [p for p in ours if p.is_running() and p.status() != "zombie"] == []
    c.stop()  # idempotent


def test_env_variable_attaches_to_a_running_cluster(monkeypatch, cluster3):
    """A notebook's start(n=2) on an instructor's 3-engine cluster uses ranks 0 and 1 (the
    lesson keeps its shape); connect() without size uses every engine."""
    owner = cluster3  # the run's shared cluster: an instructor's, to this notebook
    cluster_id = owner.ipp_cluster.cluster_id
    monkeypatch.setenv(cluster.ENV_CLUSTER, f"default:{cluster_id}")
    attached = cluster.start(n=2)
    assert not attached.owned and attached.size == 2
    assert attached.engine_ids == owner.engine_ids[:2]
    assert attached.run(fail_on_rank, -1) == [0, 1]
    attached.stop()  # only disconnects
    again = cluster.connect(profile="default", cluster_id=cluster_id)
    assert again.size == 3
    assert again.run(fail_on_rank, -1) == [0, 1, 2]
    again.stop()
    with pytest.raises(ValueError, match="size=3 engines cannot be used when waiting for only n=2"):
        cluster.connect(profile="default", cluster_id=cluster_id, n=2, size=3)
    own = cluster.start(n=1, local=True)  # engines of its own, on this machine, all the same
    try:
        assert own.owned and own.size == 1 and own.ipp_cluster.cluster_id != cluster_id
    finally:
        own.stop()
    with pytest.raises(TypeError, match="local"):
        cluster.start(n=1, local="yes")


@pytest.mark.cluster
def test_engines_that_fail_to_start_report_their_output(tmp_path):
    (tmp_path / "sitecustomize.py").write_text(
        "import sys\nprint('engine start-up exploded on purpose', flush=True)\nsys.exit(3)\n"
    )
    with pytest.raises(cluster.ClusterError, match="engine start-up exploded on purpose"):
        cluster.start(n=2, engine_env={"PYTHONPATH": str(tmp_path)}, timeout=3)


@pytest.mark.parametrize("n, error", [(0, ValueError), (-1, ValueError), (2.5, TypeError),
                                      (True, TypeError), ("4", TypeError)])
def test_bad_engine_count(n, error):
    with pytest.raises(error, match=r"n.* must be .*>= 1.* \(the number of engines\)"):
        cluster.start(n=n)


def test_bad_launcher_and_threads():
    with pytest.raises(ValueError, match=r"engines must be one of \('local', 'mpi'\)"):
        cluster.start(2, engines="slurm")
    with pytest.raises(ValueError, match=r"threads_per_engine=0: must be >= 1 \(compute threads"):
        cluster.start(2, threads_per_engine=0)


def test_missing_profile_says_how_to_create_it():
    with pytest.raises(cluster.ClusterError, match=r"no IPython profile 'nosuch'.*ipython profile create --parallel nosuch"):
        cluster.connect(profile="nosuch")
    with pytest.raises(cluster.ClusterError, match="no IPython profile 'nosuch'"):
        cluster.start(2, profile="nosuch")


def test_unknown_cluster_id_lists_running_ones():
    os.makedirs(os.path.join(os.environ["IPYTHONDIR"], "profile_default", "security"), exist_ok=True)
    with pytest.raises(cluster.ClusterError, match=r"no running cluster with id 'ghost' in profile 'default'"):
        cluster.connect("default:ghost")


def test_missing_connection_file(tmp_path):
    with pytest.raises(cluster.ClusterError, match="does not exist"):
        cluster.connect(str(tmp_path / "ipcontroller-client.json"))


def test_this_engine_outside_an_engine():
    with pytest.raises(RuntimeError, match="only works on an engine"):
        cluster.this_engine()


@pytest.mark.cluster
@pytest.mark.mpi
def test_mpi_engines_get_their_mpi_rank():
    pytest.importorskip("mpi4py", reason="needs the mpi extra: pip install '.[mpi]'")
    from coursekit.comm.mpich_segments import named_segments

    with cluster.start(n=3, engines="mpi") as c:
        infos = c.run(cluster.this_engine)
        mpi_ranks = c.run(mpi_world_rank)
        named = c.run(named_segments)
    assert [(i.rank, i.size, i.mpi) for i in infos] == [(r, 3, True) for r in range(3)]
    assert mpi_ranks == [0, 1, 2]  # coursekit's rank is the MPI rank
    # the probe unlinked MPICH's bootstrap segment: an engine ended by a signal leaves none
    assert named == [{}] * 3


@interactive
def mpi_world_rank():
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank()


@interactive
def allreduce_rank_sum():
    import numpy as np

    from coursekit.collectives import allreduce
    from coursekit.comm import engine_comm

    comm = engine_comm()
    return type(comm).__name__, comm.size, allreduce(comm, np.array([comm.rank + 1.0]))[0]


@pytest.mark.cluster
@pytest.mark.mpi
def test_a_notebook_on_part_of_an_mpi_job_gets_an_mpi_comm_of_its_ranks(monkeypatch):
    """start(n=2) attached to a 3-rank MPI job: MpiComm over ranks 0-1 only (the third
    engine is not part of the collective and stays free)."""
    pytest.importorskip("mpi4py", reason="needs the mpi extra: pip install '.[mpi]'")
    from coursekit.comm import setup_comm

    with cluster.start(n=3, engines="mpi") as owner:
        monkeypatch.setenv(cluster.ENV_CLUSTER, f"default:{owner.ipp_cluster.cluster_id}")
        with cluster.start(n=2) as part:
            assert part.mpi and setup_comm(part) == "mpi"
            assert part.run(allreduce_rank_sum) == [("MpiComm", 2, 3.0)] * 2
        assert owner.client[owner.engine_ids[2]].apply_sync(mpi_world_rank) == 2


def test_ipcluster_list_shows_a_cluster_started_here(cluster2):
    """Its launchers (coursekit.cluster.launchers, through the reaper) are named in the cluster file
    so that ipyparallel can import them again."""
    ipcluster = os.path.join(os.path.dirname(sys.executable), "ipcluster")
    listed = subprocess.run([ipcluster, "list"], capture_output=True, text=True, timeout=60)
    assert "Failed to load" not in listed.stderr, listed.stderr
    assert "ReapedEngineSet" in listed.stdout, listed.stdout


@pytest.mark.parametrize("ids, hosts, ranks", [
    ([0, 1, 2, 3], ["a", "b", "a", "b"], [0, 2, 1, 3]),  # interleaved registration
    ([0, 1, 2, 3], ["b", "a", "a", "b"], [0, 3, 1, 2]),  # hosts keep their first engine's order
    ([3, 5, 7], ["h", "h", "h"], [3, 5, 7]),  # one host: engine id order, as before
])
def test_each_hosts_engines_get_consecutive_ranks(ids, hosts, ranks):
    assert cluster.ranks_in_blocks_by_host(ids, hosts) == ranks


@pytest.mark.cluster
def test_an_engine_stalled_for_seconds_stays_and_a_killed_one_is_dropped_at_once():
    with cluster.start(n=2) as c:
        pids = c.run(os.getpid)
        os.kill(pids[0], signal.SIGSTOP)  # the whole process stalls, heart thread included
        time.sleep(2.5)  # 25 missed beats of 100 ms: dropped as dead before
        os.kill(pids[0], signal.SIGCONT)
        time.sleep(1.0)
        assert sorted(c.client.ids) == sorted(c.engine_ids)
        assert c.run(os.getpid) == pids
        os.kill(pids[1], signal.SIGKILL)  # its nanny tells the controller, no heartbeat needed
        deadline = time.monotonic() + 5.0
        while len(c.client.ids) == 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert c.client.ids == [c.engine_ids[0]]


def test_the_controller_allows_ipyparallels_30_s_without_a_heartbeat():
    assert cluster.heart_misses(100) == 300 and cluster.heart_misses(3000) == 10
    assert cluster.heart_misses(10_000) == 10  # never fewer misses than ipyparallel's
