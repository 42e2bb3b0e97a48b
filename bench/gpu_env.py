"""``make test-gpu GPU_PYTHON=...``: make an existing Python ready for the GPU run, adding
only what it lacks.

    python bench/gpu_env.py [--extra gpu|gpu-cu13] [--dry-run]

A GPU machine often comes with a Python that already holds NumPy, Numba, numba-cuda,
CuPy, pytest and more (a PyTorch image, say), and sometimes no internet. Rather than a
fresh ``.venv`` (``make test-gpu`` without GPU_PYTHON), this script:

1. installs coursekit itself with ``pip install --no-deps -e .``;
2. lists what the GPU run needs from pyproject.toml: the runtime dependencies, less those
   only the notebooks, widgets and JupyterLab need (:data:`NOT_FOR_THE_GPU_RUN`), the test
   extra's pytest, pytest-timeout and hypothesis, and the ``gpu`` extra's two packages,
   where any CuPy build counts as CuPy (``cupy-cuda12x`` or ``cupy-cuda13x``: two at once
   break it), numba-cuda is needed only with a Numba whose built-in CUDA target is
   deprecated (0.61 and newer), and the extra's NumPy cap (there for Numba) is kept only
   where the Numba there refuses its NumPy (an image with a newer Numba and NumPy, which
   it supports, is not downgraded: offline, no older NumPy may even be at hand);
3. installs the ones that are missing or too old with one ``pip install``, which pulls
   their own dependencies. pip reads PIP_NO_INDEX / PIP_FIND_LINKS from the environment,
   so ``PIP_NO_INDEX=1 PIP_FIND_LINKS=$PWD/.whl`` installs from carried wheels alone
   (bench/GPU_RUN.md lists them), also for the build of step 1 (setuptools, wheel).
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tomllib
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
#: runtime dependencies that only notebooks, widgets, the lab and the course tools import
NOT_FOR_THE_GPU_RUN = {"jupyterlab", "ipywidgets", "nbformat", "nbclient"}
#: what the GPU run takes from the test extra
TEST_NEEDS = {"pytest", "pytest-timeout", "hypothesis"}


def _name(req: str) -> str:
    return re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0].strip().lower().replace("_", "-")


def _version_tuple(v: str) -> tuple:
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def installed(name: str) -> str | None:
    """The installed version of distribution ``name``, or None."""
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def satisfied(req: str) -> bool:
    """Whether requirement ``req`` ("name>=x.y", "name<x.y", extras ignored) is met by what
    is installed (an upper bound too: the gpu extra caps NumPy)."""
    from packaging.requirements import Requirement

    version = installed(_name(req))
    return version is not None and Requirement(req).specifier.contains(version, prereleases=True)


def any_cupy() -> str | None:
    """The installed CuPy distribution (cupy, cupy-cuda12x, ...), or None."""
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower()
        if name == "cupy" or name.startswith("cupy-cuda"):
            return name
    return None


def needs_numba_cuda() -> bool:
    """numba-cuda is wanted unless it is there, or Numba is older than 0.61 (its built-in
    CUDA target, deprecated from 0.61 on, is then the one to use)."""
    if installed("numba-cuda"):
        return False
    numba = installed("numba")
    return numba is None or _version_tuple(numba) >= (0, 61)


def numba_imports() -> bool:
    """Whether this Python's Numba imports, i.e. accepts the NumPy installed beside it (Numba
    checks NumPy's version on import and refuses one it does not support)."""
    return subprocess.run([sys.executable, "-c", "import numba"], capture_output=True).returncode == 0


def missing(extra: str = "gpu", pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The requirements the GPU run needs and this Python lacks, as pip arguments."""
    project = tomllib.loads(pyproject.read_text())["project"]
    extras = project["optional-dependencies"]
    if extra not in extras:
        raise SystemExit(f"gpu_env: pyproject.toml has no extra {extra!r}; "
                         f"allowed: {', '.join(k for k in extras if k.startswith('gpu'))}")
    wanted = [r for r in project["dependencies"] if _name(r) not in NOT_FOR_THE_GPU_RUN]
    wanted += [r for r in extras["test"] if _name(r) in TEST_NEEDS]
    out = [r for r in wanted if not satisfied(r)]
    for r in extras[extra]:
        name = _name(r)
        if name.startswith("cupy"):
            if any_cupy() is None:
                out.append(r)
        elif name == "numba-cuda":
            if needs_numba_cuda():
                out.append(r)
        elif name == "numpy":  # the cap is Numba's: a NumPy that the Numba there accepts stays
            if not satisfied(r) and not numba_imports():
                out.append(r)
        elif not satisfied(r):
            out.append(r)
    return out


def pip(*args: str, dry_run: bool = False) -> None:
    cmd = [sys.executable, "-m", "pip", "install", *args]
    print("+", " ".join(cmd), flush=True)
    if not dry_run:
        subprocess.run(cmd, cwd=ROOT, check=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--extra", default="gpu", help="the pyproject extra with the GPU packages")
    parser.add_argument("--dry-run", action="store_true", help="print the pip commands only")
    args = parser.parse_args(argv)
    todo = missing(args.extra)  # before the editable install, which changes nothing of them
    try:
        pip("--no-deps", "-e", ".", dry_run=args.dry_run)
        if todo:
            pip(*todo, dry_run=args.dry_run)
        else:
            print(f"gpu_env: {sys.executable} already has every package the GPU run needs")
    except subprocess.CalledProcessError as e:
        print(f"gpu_env: pip failed (exit {e.returncode}). Offline, give it the wheels: "
              "PIP_NO_INDEX=1 PIP_FIND_LINKS=$PWD/.whl (bench/GPU_RUN.md)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
