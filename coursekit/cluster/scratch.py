"""Scratch folders that live exactly as long as the process that made them, even if it is killed.

A chapter writes files to try things out (chapter 3 packs the digits and writes one file
per sample; chapter 4's servers write checkpoints). They must outlive the cell, since the
cluster and its panels keep using them after Run All, but not the kernel: JupyterLab's
"Shut Down Kernel", nbval and the out-of-memory killer end it without running any Python
clean-up. :func:`scratch_dir` therefore starts a small watcher::

    python -m coursekit.cluster.scratch OWNER_PID FOLDER

that polls every ``POLL_S`` seconds and removes FOLDER once OWNER is gone.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from coursekit.cluster.processes import alive

__all__ = ["POLL_S", "remove_when_gone", "scratch_dir"]

POLL_S = 0.5


def scratch_dir(prefix: str = "coursekit-") -> Path:
    """A new folder in the temp folder, removed when this process ends (however it ends).

    ``prefix`` must start with ``coursekit-`` (the watcher removes nothing else)."""
    if not isinstance(prefix, str):
        raise TypeError(f"prefix must be a str starting with 'coursekit-'; got "
                        f"{type(prefix).__name__} {prefix!r:.60}")
    if not prefix.startswith("coursekit-"):
        raise ValueError(f"prefix must start with 'coursekit-'; got {prefix!r}")
    path = Path(tempfile.mkdtemp(prefix=prefix))
    subprocess.Popen(
        [sys.executable, "-m", "coursekit.cluster.scratch", str(psutil.Process().pid), str(path)],
        stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        start_new_session=True)  # a Ctrl-C to the owner's group does not reach it
    return path


def remove_when_gone(owner_pid: int, folder: Path, poll_s: float = POLL_S) -> None:
    """Wait until process ``owner_pid`` has ended, then remove ``folder`` and all in it.

    Only a folder :func:`scratch_dir` makes (``coursekit-*`` directly in the temp folder):
    ValueError for any other path, before waiting.
    """
    folder = Path(folder).resolve()
    if folder.parent != Path(tempfile.gettempdir()).resolve() or not folder.name.startswith("coursekit-"):
        raise ValueError(f"{folder} is not a coursekit scratch folder "
                         f"({Path(tempfile.gettempdir()) / 'coursekit-*'}); refusing to remove it")
    try:
        owner = psutil.Process(owner_pid)
        while alive(owner):
            time.sleep(poll_s)
    except psutil.NoSuchProcess:
        pass
    shutil.rmtree(folder, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or not args[0].isdigit():
        print("usage: python -m coursekit.cluster.scratch OWNER_PID FOLDER", file=sys.stderr)
        return 2
    try:
        remove_when_gone(int(args[0]), Path(args[1]))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
