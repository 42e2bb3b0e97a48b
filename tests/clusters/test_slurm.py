"""Every notebook, unchanged, on the README's Slurm profile submitted to a real Slurm.

The instructor's path, for real: ``coursekit profiles slurm ... --sinfo
"$(sinfo ...)"`` renders the profile, ``ipcluster start --daemonize`` submits the engines
with ``sbatch`` (one task per GPU, each engine sees its own GPU as CUDA_VISIBLE_DEVICES),
``coursekit preflight`` checks the cluster, the notebooks attach with
COURSEKIT_CLUSTER, and ``ipcluster stop`` ends the job. What stays unchecked here: real
GPUs behind the GRES, and compute nodes other than this machine (tests/clusters/slurm.py).
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ipyparallel import interactive

from attached import DaemonCluster, assert_notebooks_pass_and_cluster_survives
from slurm import SlurmCluster

pytestmark = pytest.mark.cluster


@pytest.fixture
def slurm(tmp_path):
    with SlurmCluster(tmp_path / "slurm", gpus=4) as running:
        yield running


def wait_until_no_jobs(slurm, timeout=60.0) -> str:
    deadline = time.monotonic() + timeout
    while (jobs := slurm.run("squeue", "-h").strip()) and time.monotonic() < deadline:
        time.sleep(0.5)
    return jobs


def test_the_private_slurm_schedules_gpu_jobs(slurm, tmp_path):
    from coursekit.cluster.profiles import parse_sinfo

    assert parse_sinfo(slurm.run("sinfo", "-h", "-o", "%P %G")) == {"gpu": 4}
    out = tmp_path / "job.out"
    slurm.run("sbatch", f"--output={out}", "--gres=gpu:2", "--ntasks=2",
              "--wrap", "srun bash -c 'echo task $SLURM_LOCALID'")
    assert wait_until_no_jobs(slurm) == ""
    assert sorted(out.read_text().split("\n")[:2]) == ["task 0", "task 1"]
    slurm.run("sbatch", "--gres=gpu:5", "--wrap", "true", check=False)  # more than it has
    assert wait_until_no_jobs(slurm, 5) == ""  # refused, never queued


@interactive
def engine_slurm_facts():
    import os
    return os.environ.get("SLURM_JOB_ID"), os.environ.get("CUDA_VISIBLE_DEVICES")


def test_every_notebook_runs_on_the_readme_slurm_profile(slurm, tmp_path):
    ipython_dir = tmp_path / "ipython"
    rendered = subprocess.run(
        [sys.executable, "-m", "coursekit", "profiles", "slurm", "--partition", "gpu", "--nodes", "1",
         "--gpus-per-node", "4", "--time", "00:30:00", "--ipython-dir", str(ipython_dir),
         "--profile", "course", "--controller-ip", "127.0.0.1",
         "--sinfo", slurm.run("sinfo", "-h", "-o", "%P %G")],
        capture_output=True, text=True, env=slurm.env)
    assert rendered.returncode == 0, rendered.stderr
    slurm_env = {"SLURM_CONF": str(slurm.conf)}
    with DaemonCluster(ipython_dir, "course", n=4, env=slurm_env) as running:
        (job,) = slurm.run("squeue", "-h", "-o", "%i %j %T %b").strip().splitlines()
        job_id, name, state, gres = job.split()
        assert name.startswith("ipengine") and state == "RUNNING" and gres.endswith("gpu:4")
        import ipyparallel as ipp
        client = ipp.Client(str(running.client_file))
        try:
            facts = client[:].apply_sync(engine_slurm_facts)
        finally:
            client.close()
        assert sorted(facts) == [(job_id, str(gpu)) for gpu in range(4)]  # one GPU each
        submitted = ipython_dir / "profile_course" / "slurm_engine.sbatch"
        assert "--gres=gpu:4" in submitted.read_text()
        assert not Path("slurm_engine.sbatch").exists(), "ipcluster wrote its script into the cwd"
        preflight = subprocess.run(
            [sys.executable, "-m", "coursekit", "preflight", "--cluster", str(running.client_file),
             "--engines", "4", "--nodes", "1"], capture_output=True, text=True,
            env=dict(os.environ, **slurm_env), timeout=300)
        assert preflight.returncode == 0, preflight.stdout + preflight.stderr
        assert_notebooks_pass_and_cluster_survives(running.client_file, 4)
    assert wait_until_no_jobs(slurm) == ""  # ipcluster stop ended the engines' job
