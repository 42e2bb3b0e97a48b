"""Instructor profiles: Slurm scripts rendered, parsed back and run with a stand-in srun;
the MPI profile started for real with the mpich wheel's mpiexec.

Not checked here (no Slurm, no GPUs): sbatch accepting the script, the scheduler's GPU
binding, engines on several hosts reaching the controller. The stand-in srun below plays
Slurm's part of setting SLURM_NODEID / SLURM_LOCALID for every task.
"""

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from coursekit.cluster.profiles import (ProfileError, SlurmSpec, check_sbatch, main, parse_sinfo,
                                render_mpi, render_slurm, write_profile)

SINFO = "gpu* gpu:tesla:4(S:0-1)\nbig gpu:a100:8,tmpdisk:100\ncpu (null)\n"


def spec(**kw):
    base = dict(partition="gpu", nodes=2, gpus_per_node=4, time="01:00:00",
                ipython_dir="/shared/ipython", venv=sys.prefix)
    base.update(kw)
    return SlurmSpec(**base)


def test_parse_sinfo():
    assert parse_sinfo(SINFO) == {"gpu": 4, "big": 8, "cpu": 0}
    with pytest.raises(ProfileError, match="no partitions"):
        parse_sinfo("\n")


def test_render_and_parse_back():
    files = render_slurm(spec(partitions=parse_sinfo(SINFO), account="course42"))
    opts = check_sbatch(files["engines.sbatch"], spec())
    assert opts["ntasks"] == "8" and opts["gres"] == "gpu:4" and opts["partition"] == "gpu"
    assert opts["account"] == "course42"
    config = files["ipcluster_config.py"]
    assert 'c.Cluster.controller_ip = "*"' in config and "c.Cluster.n = 8" in config
    assert 'engine_launcher_class = "slurm"' in config
    compile(config, "ipcluster_config.py", "exec")  # valid Python


def _controller_settings(config: str) -> dict:
    """The ``--Class.trait=value`` arguments a rendered ipcluster_config.py gives the controller."""
    from traitlets.config import Config
    c = Config()
    exec(config, {"get_config": lambda: c})
    return dict(arg[2:].split("=", 1) for arg in c.Cluster.controller_args)


def test_the_profiles_controller_drops_an_engine_only_after_the_course_s_heart_failure_time(tmp_path):
    from coursekit.cluster import HEART_FAILURE_S
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "mpiexec").touch()  # the MPI profile only names the venv's mpiexec
    for config in (render_slurm(spec())["ipcluster_config.py"],
                   render_mpi(2, "/shared/ipython", venv=str(tmp_path))["ipcluster_config.py"]):
        args = _controller_settings(config)
        beat_s = int(args["HeartMonitor.period"]) / 1000
        assert beat_s * int(args["HeartMonitor.max_heartmonitor_misses"]) >= HEART_FAILURE_S


@pytest.mark.parametrize("kw, match", [
    (dict(partition=""), "partition \\(queue\\) name is missing"),
    (dict(partition="gpx", partitions=parse_sinfo(SINFO)), "does not exist.*available"),
    (dict(gpus_per_node=8, partitions=parse_sinfo(SINFO)), "impossible.*has 4 GPUs"),
    (dict(gpus_per_node=1, partition="cpu", partitions=parse_sinfo(SINFO)), "impossible.*0 GPUs"),
    (dict(gpus_per_node=64), "impossible.*more than 16"),
    (dict(gpus_per_node=0), "gpus_per_node must be a positive"),
    (dict(nodes=0), "nodes must be a positive"),
    (dict(time="2 hours"), "time limit"),
    (dict(ipython_dir="ipython"), "absolute path"),
])
def test_bad_specs(kw, match):
    with pytest.raises(ProfileError, match=match):
        render_slurm(spec(**kw))


def test_all_problems_reported_at_once():
    with pytest.raises(ProfileError) as info:
        render_slurm(spec(partition="", nodes=0, time="x"))
    assert str(info.value).count("\n") == 3


def test_check_sbatch_catches_edits():
    good = render_slurm(spec())["engines.sbatch"]
    for old, new, match in [
        ("--ntasks=8", "--ntasks=6", "--ntasks"),
        ("--gres=gpu:4", "--gres=gpu:2", "--gres"),
        ("CUDA_VISIBLE_DEVICES=$SLURM_LOCALID", "CUDA_VISIBLE_DEVICES=0", "local GPU"),
        ("#SBATCH --export=ALL", "#SBATCH --exportt=ALL", "unknown sbatch option"),
        ("export IPYTHONDIR", "#export IPYTHONDIR", "IPYTHONDIR"),
    ]:
        assert old in good
        with pytest.raises(ProfileError, match=match):
            check_sbatch(good.replace(old, new), spec())


FAKE_SRUN = """#!/bin/bash
# Stand-in for Slurm's srun: NODES x PER_NODE tasks with Slurm's task variables.
while [[ "$1" == --* ]]; do shift; done
for node in $(seq 0 $((FAKE_NODES - 1))); do
  for local in $(seq 0 $((FAKE_PER_NODE - 1))); do
    SLURM_NODEID=$node SLURM_LOCALID=$local SLURM_PROCID=$((node * FAKE_PER_NODE + local)) "$@"
  done
done
"""


def test_rendered_script_binds_one_gpu_per_local_rank(tmp_path):
    """ipyparallel's own Slurm launcher writes the batch file from our template; bash runs
    it with a stand-in srun; every task must see exactly its local rank's GPU."""
    from ipyparallel.cluster.launcher import SlurmEngineSetLauncher

    s = spec(ipython_dir=str(tmp_path / "ipython"))
    folder = write_profile(render_slurm(s), s.ipython_dir, s.profile)
    probe = ("import os; print(*[os.environ[k] for k in ('SLURM_NODEID', 'SLURM_LOCALID', "
             "'CUDA_VISIBLE_DEVICES', 'IPYTHONDIR', 'NUMBA_NUM_THREADS')])")
    launcher = SlurmEngineSetLauncher(
        profile_dir=str(folder), cluster_id="t1", work_dir=str(tmp_path),
        batch_template_file=str(folder / "engines.sbatch"),
        engine_cmd=[sys.executable, "-c", probe], engine_args=[])
    launcher.write_batch_script(s.engines)
    script = Path(launcher.batch_file).read_text()
    check_sbatch(script, s)
    assert "--job-name=ipengine-t1" in script
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(stat.S_IRWXU)
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_NODES="2",
               FAKE_PER_NODE="4")
    out = subprocess.run(["bash", launcher.batch_file], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()]
    assert len(rows) == 8
    for node, local, visible, ipdir, threads in rows:
        assert visible == local and ipdir == s.ipython_dir and threads == "1"
    assert sorted((int(r[0]), int(r[1])) for r in rows) == [(n, l) for n in (0, 1)
                                                           for l in range(4)]


def test_cli_writes_profile_and_rejects_bad_queue(tmp_path, capsys):
    ipdir = str(tmp_path / "ip")
    assert main(["slurm", "--partition", "gpu", "--nodes", "1", "--gpus-per-node", "2",
                 "--time", "30", "--ipython-dir", ipdir, "--sinfo", SINFO]) == 0
    assert (Path(ipdir) / "profile_coursekit" / "engines.sbatch").is_file()
    assert "COURSEKIT_CLUSTER=coursekit" in capsys.readouterr().out
    assert main(["slurm", "--partition", "gpux", "--nodes", "1", "--gpus-per-node", "2",
                 "--time", "30", "--ipython-dir", ipdir, "--sinfo", SINFO]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_render_mpi_needs_mpiexec(tmp_path):
    with pytest.raises(ProfileError, match="mpiexec"):
        render_mpi(2, str(tmp_path), venv=str(tmp_path))
    with pytest.raises(ProfileError, match="engines"):
        render_mpi(0, str(tmp_path))


@pytest.mark.cluster
@pytest.mark.mpi
def test_mpi_profile_starts_mpi_engines(ipython_dir):
    """The rendered MPI profile, started by ipyparallel for real: engines are MPI ranks,
    and preflight (which needs mpi4py and MPI ranks) passes with the MPI Comm backend."""
    pytest.importorskip("mpi4py")
    import ipyparallel as ipp

    from coursekit import cluster
    from coursekit.cluster.preflight import run_preflight

    folder = write_profile(render_mpi(2, ipython_dir, profile="ck-mpi-test"), ipython_dir,
                           "ck-mpi-test")
    ipp_cluster = ipp.Cluster(profile_dir=str(folder), log_level=40)
    ipp_cluster.start_cluster_sync()
    try:
        c = cluster.connect(str(folder / "security" /
                                f"ipcontroller-{ipp_cluster.cluster_id}-client.json"),
                            n=2, timeout=60)
        try:
            assert c.mpi and c.size == 2
            report = run_preflight(c, mpi=True)
            assert report.ok, report.text()
            assert report.backend == "mpi" and "intra-host" in report.links
        finally:
            c.stop()
    finally:
        ipp_cluster.stop_cluster_sync()
