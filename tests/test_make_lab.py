"""`make lab`: the link it prints, and the ones JupyterLab prints, open notebooks/00_setup.ipynb.

`make -n` prints the recipe without running it: nothing is installed, no server starts.
JupyterLab prints its links from its default URL (``--LabApp.default_url``), so that URL
must be the notebook's /lab/tree/<path> page, not /lab (the Launcher).
"""

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FIRST = "notebooks/00_setup.ipynb"


@pytest.mark.skipif(shutil.which("make") is None, reason="needs GNU make")
def test_make_lab_links_open_the_setup_notebook():
    recipe = subprocess.run(["make", "-n", "lab", "PORT=8899"], cwd=ROOT, capture_output=True,
                            text=True, check=True, timeout=30).stdout.splitlines()
    echoed = next(line for line in recipe if line.startswith("echo ") and "Starting JupyterLab" in line)
    assert re.search(rf"http://127\.0\.0\.1:8899/lab/tree/{re.escape(FIRST)}\b", echoed)
    lab = shlex.split(next(line for line in recipe if "jupyter lab" in line))
    assert "--LabApp.default_url=/lab/tree/" + FIRST in lab  # what JupyterLab's links open
    assert "--ServerApp.port=8899" in lab and lab[-1] == FIRST  # the browser it starts, too
    assert (ROOT / FIRST).is_file()
