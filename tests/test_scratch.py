"""Scratch folders outlive cells but not their kernel, even one killed with SIGKILL."""

import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from coursekit.cluster import scratch

MAKER = ("from coursekit.cluster.scratch import scratch_dir; d = scratch_dir('coursekit-test-'); "
         "(d / 'f.npy').write_bytes(b'x'); print(d, flush=True); import time; time.sleep(60)")


def wait_gone(path: Path, seconds: float = 10.0) -> bool:
    deadline = time.monotonic() + seconds
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    return not path.exists()


@pytest.mark.slow  # an owner process, killed; the watcher polls
@pytest.mark.parametrize("how", [signal.SIGKILL, signal.SIGTERM])
def test_the_folder_goes_when_its_owner_is_killed(how):
    owner = subprocess.Popen([sys.executable, "-c", MAKER], stdout=subprocess.PIPE, text=True)
    try:
        folder = Path(owner.stdout.readline().strip())
        assert (folder / "f.npy").exists()
        time.sleep(2 * scratch.POLL_S)
        assert folder.exists(), "removed while its owner was still alive"
        owner.send_signal(how)
        owner.wait(10)
        assert wait_gone(folder), f"{folder} outlived its owner"
    finally:
        owner.kill()
        owner.wait()


def test_only_coursekit_scratch_folders_are_ever_removed(tmp_path):
    with pytest.raises(ValueError, match="prefix must start with 'coursekit-'"):
        scratch.scratch_dir("mine-")
    victim = Path(tempfile.mkdtemp(prefix="not-coursekit-"))
    try:
        with pytest.raises(ValueError, match="not a coursekit scratch folder"):
            scratch.remove_when_gone(999999999, victim)
        done = subprocess.run([sys.executable, "-m", "coursekit.cluster.scratch", "1", str(victim)],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 2 and "refusing to remove it" in done.stderr
        assert victim.exists()
    finally:
        victim.rmdir()
