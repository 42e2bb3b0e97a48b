"""pyproject.toml (pip) and environment.yml (conda / Binder) list the same packages; the
package root reads as the course's map (the cluster's lifecycle and the course's tooling
are a package each)."""

import importlib
import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CONDA_TO_PIP = {"pytorch": "torch"}  # conda-forge names that differ from PyPI's
NOT_PACKAGES = {"python", "pip"}
# make test-gpu's extras: CUDA wheels for a machine with an NVIDIA GPU, neither in the
# conda (Binder) environment nor in constraints.txt, which CPU machines lock
GPU_EXTRAS = {"gpu", "gpu-cu13"}
# the instructor's nbgrader (make nbgrader-env builds .venv-nbgrader): pinned in pyproject.toml
# itself, never in the conda (Binder) environment, whose lab its extension would change
INSTRUCTOR_EXTRAS = {"nbgrader"}


def split(requirement: str) -> tuple[str, str]:
    """'numpy>=1.26' -> ('numpy', '>=1.26'); conda's 'x=1.0' means pip's 'x==1.0'."""
    name, spec = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", requirement).groups()
    spec = re.sub(r"^=(?!=)", "==", spec.replace(" ", ""))
    return name.lower().replace("_", "-"), spec


def pip_requirements() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lists = [project["dependencies"], *(v for k, v in project["optional-dependencies"].items()
                                        if k not in GPU_EXTRAS | INSTRUCTOR_EXTRAS)]
    return dict(split(r) for group in lists for r in group
                if not r.startswith("coursekit["))  # an extra that names others (bench)


def test_make_lab_installs_the_torch_extra_and_bench_reuses_its_pin():
    """Chapter 09 runs PyTorch beside the course: the default EXTRAS install it, and the
    bench extra pins no second version of it."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert [split(r)[0] for r in extras["torch"]] == ["torch"]
    assert extras["bench"] == ["coursekit[torch]"]
    default = re.search(r"^EXTRAS \?= (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert default and "torch" in default.group(1).split(","), "make lab must install torch"


def test_the_gpu_extras_offer_one_cupy_and_numba_cuda_for_cuda_12_and_13():
    """... and a NumPy below 2.5, where numba-cuda still compiles (NVIDIA/numba-cuda#907)."""
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(extras) >= GPU_EXTRAS
    for extra, cuda in (("gpu", "12"), ("gpu-cu13", "13")):
        names = [split(r.split("[")[0])[0] for r in extras[extra]]
        assert sorted(names) == ["cupy-cuda" + cuda + "x", "numba-cuda", "numpy"], extras[extra]
        assert any(r.startswith(f"numba-cuda[cu{cuda}]") for r in extras[extra])
        assert "numpy<2.5" in extras[extra]


def conda_requirements() -> dict[str, str]:
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    found = {}
    for entry in env["dependencies"]:
        if isinstance(entry, str):
            name, spec = split(entry)
            if name not in NOT_PACKAGES:
                found[CONDA_TO_PIP.get(name, name)] = spec
    return found


def test_pip_and_conda_list_the_same_packages_and_versions():
    assert conda_requirements() == pip_requirements()


def test_conda_environment_installs_coursekit_itself():
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip_section = next(e["pip"] for e in env["dependencies"] if isinstance(e, dict))
    assert "-e ." in pip_section


def test_split_normalizes_conda_pins():
    assert split("pytorch=2.13.0") == ("pytorch", "==2.13.0")
    assert split("scikit_learn >= 1.4") == ("scikit-learn", ">=1.4")


def test_every_dependency_is_pinned_within_its_range():
    """The stored notebook outputs are numbers computed with constraints.txt's versions:
    every package coursekit asks for is pinned there, inside pyproject.toml's range."""
    from packaging.specifiers import SpecifierSet

    pins = dict(split(line) for line in (ROOT / "constraints.txt").read_text().splitlines()
                if line.strip() and not line.startswith("#"))
    for name, spec in pip_requirements().items():
        if spec.startswith("=="):
            continue  # pinned in pyproject.toml itself (torch for the benchmarks)
        assert name in pins, f"{name} is not pinned in constraints.txt (run make lock)"
        version = pins[name].removeprefix("==")
        assert version in SpecifierSet(spec), f"constraints.txt pins {name}=={version}, outside {spec}"


# The cluster's lifecycle and the course's tooling, each one package (issue 29, "Layout").
LIFECYCLE = ("cluster", "runner", "reaper", "processes", "contention", "scratch", "profiles",
             "preflight", "live")
TOOLING = ("notebooks", "release", "gradebook", "lms", "feedback")


def test_the_package_root_holds_no_module_of_the_cluster_or_the_course_tooling():
    import coursekit

    for package in {ROOT / "coursekit", Path(coursekit.__file__).resolve().parent}:
        at_root = {path.stem for path in package.glob("*.py")} & {*LIFECYCLE, *TOOLING}
        assert not at_root, f"{sorted(at_root)} belong in coursekit/cluster/ or coursekit/course/"
        assert all((package / group / "__init__.py").is_file() for group in ("cluster", "course"))
    for name in LIFECYCLE[1:]:
        assert importlib.import_module(f"coursekit.cluster.{name}").__file__.endswith(f"cluster/{name}.py")
    for name in TOOLING:
        assert importlib.import_module(f"coursekit.course.{name}").__file__.endswith(f"course/{name}.py")


def test_from_coursekit_import_cluster_gives_the_start_function():
    from coursekit import cluster
    from coursekit.cluster import CourseCluster, connect, start, this_engine

    assert cluster.__name__ == "coursekit.cluster" and hasattr(cluster, "__path__")  # the package
    assert cluster.start is start and cluster.connect is connect and callable(start)
    assert cluster.CourseCluster is CourseCluster and cluster.this_engine is this_engine


def test_every_coursekit_command_runs_the_main_of_a_module_in_cluster_or_course():
    from coursekit.__main__ import COMMANDS, MODULES

    assert set(MODULES) == set(COMMANDS)
    for command, module in MODULES.items():
        assert module in (f"coursekit.cluster.{command}", f"coursekit.course.{command}")
        assert callable(importlib.import_module(module).main)
