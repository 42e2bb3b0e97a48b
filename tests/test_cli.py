"""The ``coursekit`` console script that pyproject.toml declares, as pip installs it."""

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(sys.executable).parent / "coursekit"


def coursekit(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, timeout=120)


def test_without_a_command_it_lists_the_commands():
    done = coursekit()
    assert done.returncode == 2
    for command in ("preflight", "profiles", "release", "notebooks"):
        assert f"  {command}" in done.stdout


def test_an_unknown_command_names_the_allowed_ones():
    done = coursekit("lab")
    assert done.returncode == 2
    assert "unknown command 'lab'; allowed: preflight, profiles, release, notebooks, workspace" in done.stderr


def test_a_command_runs_its_module(tmp_path):
    done = coursekit("profiles", "mpi", "--engines", "2", "--ipython-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "profile_coursekit-mpi" / "ipcluster_config.py").is_file()
    refused = coursekit("profiles", "mpi", "--engines", "0", "--ipython-dir", str(tmp_path))
    assert refused.returncode == 2 and "error:" in refused.stderr
