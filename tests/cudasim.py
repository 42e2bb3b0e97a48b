"""Run a test module in numba's CUDA simulator, in a pytest process of its own.

``NUMBA_ENABLE_CUDASIM=1`` must be set before numba.cuda is first imported, and it would
turn every later CUDA use in the process into the simulator, so a ``*_cuda_sim.py`` module
skips itself in the main run and a test there calls :func:`run_in_simulator` on it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]  # the repository: its conftest.py is the run's


def run_in_simulator(test_file: Path, timeout: float = 240) -> str:
    """Run ``test_file`` with pytest under NUMBA_ENABLE_CUDASIM=1; AssertionError with the
    output's tail unless every test in it passed (none skipped). Returns its stdout."""
    env = {**os.environ, "NUMBA_ENABLE_CUDASIM": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test_file)],
        env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    assert " passed" in proc.stdout and "skipped" not in proc.stdout, proc.stdout[-2000:]
    return proc.stdout


def gpu_or_simulator() -> bool:
    """Whether numba.cuda runs here: the simulator is on, or numba finds a usable GPU (a
    ``*_cuda_sim.py`` module that also runs on hardware skips itself otherwise)."""
    if os.environ.get("NUMBA_ENABLE_CUDASIM") == "1":
        return True
    from numba import cuda

    return cuda.is_available()
