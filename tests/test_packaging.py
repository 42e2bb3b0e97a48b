"""pyproject.toml (pip) and environment.yml (conda / Binder) list the same packages."""

import re
import tomllib
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
CONDA_TO_PIP = {"pytorch": "torch"}  # conda-forge names that differ from PyPI's
NOT_PACKAGES = {"python", "pip"}


def split(requirement: str) -> tuple[str, str]:
    """'numpy>=1.26' -> ('numpy', '>=1.26'); conda's 'x=1.0' means pip's 'x==1.0'."""
    name, spec = re.match(r"^\s*([A-Za-z0-9_.\-]+)\s*(.*)$", requirement).groups()
    spec = re.sub(r"^=(?!=)", "==", spec.replace(" ", ""))
    return name.lower().replace("_", "-"), spec


def pip_requirements() -> dict[str, str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    lists = [project["dependencies"], *project["optional-dependencies"].values()]
    return dict(split(r) for group in lists for r in group)


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
