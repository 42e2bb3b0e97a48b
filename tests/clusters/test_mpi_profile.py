"""Every notebook, unchanged, on the README's MPI profile (engines started by mpiexec)."""

import subprocess
import sys

import pytest

from attached import DaemonCluster, assert_notebooks_pass_and_cluster_survives, census

pytestmark = [pytest.mark.cluster, pytest.mark.mpi]


def test_every_notebook_runs_on_the_mpi_profile_and_leaves_it_intact(tmp_path):
    pytest.importorskip("mpi4py")
    profile = subprocess.run(
        [sys.executable, "-m", "coursekit", "profiles", "mpi", "--engines", "4",
         "--ipython-dir", str(tmp_path), "--profile", "course-mpi"],
        capture_output=True, text=True)
    assert profile.returncode == 0, profile.stderr
    with DaemonCluster(tmp_path, "course-mpi", n=4) as running:
        assert len(census(running.client_file, 4)) == 4
        assert_notebooks_pass_and_cluster_survives(running.client_file, 4)
