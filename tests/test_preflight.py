"""Preflight against a real local cluster: what passes, what fails, and the fix-it lines.

Not checked here: engines on several hosts and real GPUs (this machine has neither); the
GPU check is exercised by asking for GPUs the local engines do not have, the GPU probe's
kernel in numba's simulator (tests/parallel/test_model_parallel_cuda_sim.py).
"""

import glob
import os
import subprocess
import sys

import pytest

from coursekit.cluster.preflight import engine_facts, run_preflight


@pytest.fixture
def local(cluster2):
    """The run's shared 2-engine cluster (tests/conftest.py)."""
    return cluster2


def _client_file(ipython_dir, c):
    files = glob.glob(os.path.join(ipython_dir, "profile_default", "security",
                                   f"ipcontroller-{c.ipp_cluster.cluster_id}-client.json"))
    assert len(files) == 1, files
    return files[0]


def test_local_cluster_passes(local):
    report = run_preflight(local)
    assert report.ok, report.text()
    assert report.engines == 2 and sum(report.hosts.values()) == 2
    assert report.backend == "zmq"
    alpha, beta = report.links["intra-host"]
    assert 0 < alpha < 0.1 and 0 < beta < 1e-6  # 10 ns/B = 0.1 GB/s would be absurdly slow
    assert "preflight passed" in report.text()


def test_requirements_this_cluster_cannot_meet(local):
    report = run_preflight(local, gpus_per_engine=1, mpi=True, nodes=2)
    failed = {c.name: c for c in report.checks if not c.ok}
    assert set(failed) == {"controller", "nodes", "gpus", "mpi"}
    assert "controller_ip = '*'" in failed["controller"].fix
    assert "CUDA_VISIBLE_DEVICES" in failed["gpus"].fix
    assert "2 engine(s) see fewer than the 1 GPU(s) asked for" in failed["gpus"].detail
    assert "rank 0 on" in failed["gpus"].detail and ": 0 (no GPU (" in failed["gpus"].detail
    assert "engine 0 (" in report.text() and "engine 1 (" in report.text()
    assert "gpu kernel" not in {c.name for c in report.checks}  # no GPU: nothing to launch on
    assert "mpiexec" in failed["mpi"].fix
    assert "preflight FAILED" in report.text() and "fix:" in report.text()


def test_engine_facts_do_not_start_mpi_in_an_engine_no_mpi_launcher_started():
    """An MPI singleton would leave its segment in /dev/shm when the engine is killed."""
    pytest.importorskip("mpi4py")
    from coursekit.cluster import MPI_LAUNCHER_VARIABLES
    env = {k: v for k, v in os.environ.items() if k not in MPI_LAUNCHER_VARIABLES}
    probe = subprocess.run(
        [sys.executable, "-c", "import sys; from coursekit.cluster.preflight import engine_facts;"
         "print(engine_facts()['mpi']); print('mpi4py.MPI' in sys.modules)"],
        capture_output=True, text=True, env=env, timeout=120)
    assert probe.returncode == 0, probe.stderr
    facts_mpi, imported = probe.stdout.splitlines()
    assert facts_mpi.startswith("mpi4py ") and "not an MPI rank" in facts_mpi
    assert imported == "False"


def test_gpu_count_follows_cuda_visible_devices(monkeypatch, tmp_path):
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\nfor i in 0 1 2 3; do echo \"GPU $i: Tesla P40 (UUID: x$i)\"; done\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert engine_facts()["gpus"] == 4
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2")
    assert engine_facts()["gpus"] == 1
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert engine_facts()["gpus"] == 0


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "coursekit", "preflight", *args],
                          capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, COURSEKIT_CLUSTER=""))


def test_cli(local, ipython_dir):
    spec = _client_file(ipython_dir, local)
    ok = _cli("--cluster", spec)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "engines: 2" in ok.stdout and "Comm backend: zmq" in ok.stdout
    bad = _cli("--cluster", spec, "--gpus-per-engine", "1")
    assert bad.returncode == 1 and "fix:" in bad.stdout
    none = _cli()
    assert none.returncode == 2 and "COURSEKIT_CLUSTER" in none.stderr
    missing = _cli("--cluster", "/nonexistent/ipcontroller-client.json")
    assert missing.returncode == 1 and "does not exist" in missing.stderr
