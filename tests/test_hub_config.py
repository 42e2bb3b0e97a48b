"""The class's JupyterHub config: settings become Slurm requests, and typos stop the hub
with the allowed form (the hub itself is tested on a real Slurm in tests/clusters)."""

import runpy

import pytest
from traitlets.config import Config

from coursekit.cluster.profiles import TEMPLATES

CONFIG = TEMPLATES / "jupyterhub" / "jupyterhub_config.py"


def load(monkeypatch, tmp_path, students="ada\nbob\n", **settings) -> Config:
    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True, exist_ok=True)
    for tool in ("batchspawner-singleuser", "jupyterhub-singleuser"):
        (venv / "bin" / tool).touch()
    (tmp_path / "students").write_text(students)
    monkeypatch.setenv("COURSEKIT_HUB_VENV", str(venv))
    monkeypatch.setenv("COURSEKIT_HUB_CLASS_LIST", str(tmp_path / "students"))
    for name, value in settings.items():
        monkeypatch.setenv(f"COURSEKIT_HUB_{name.upper()}", value)
    config = Config()
    runpy.run_path(str(CONFIG), init_globals={"get_config": lambda: config})
    return config


def test_settings_become_the_students_slurm_jobs(monkeypatch, tmp_path):
    c = load(monkeypatch, tmp_path, partition="a100", cpus="9", gpus="2", memory="30G",
             time="90")
    slurm = c.SlurmSpawner
    assert (slurm.req_partition, slurm.req_nprocs, slurm.req_gres, slurm.req_memory,
            slurm.req_runtime) == ("a100", "9", "gpu:2", "30G", "90")
    assert c.Authenticator.allowed_users == {"ada", "bob"}
    assert slurm.batchspawner_singleuser_cmd == str(tmp_path / "venv/bin/batchspawner-singleuser")
    assert c.Spawner.cmd == [str(tmp_path / "venv/bin/jupyterhub-singleuser")]


def test_cpu_only_class_requests_no_gpus(monkeypatch, tmp_path):
    assert load(monkeypatch, tmp_path, gpus="0").SlurmSpawner.req_gres == ""


@pytest.mark.parametrize("setting, value, allowed", [
    ("time", "2 hours", "02:00:00"),
    ("partition", "gpu queue", "sinfo"),
    ("cpus", "0", "positive"),
    ("memory", "lots", "16G"),
])
def test_a_typo_names_what_is_allowed(monkeypatch, tmp_path, setting, value, allowed):
    with pytest.raises(ValueError, match=f"COURSEKIT_HUB_{setting.upper()}.*{allowed}"):
        load(monkeypatch, tmp_path, **{setting: value})


@pytest.mark.parametrize("students, problem", [("\n", "nobody"), ("ada\nbob smith\n", "bob smith")])
def test_a_bad_class_list_is_refused(monkeypatch, tmp_path, students, problem):
    with pytest.raises(ValueError, match=problem):
        load(monkeypatch, tmp_path, students=students)


def test_a_venv_without_the_class_extra_is_refused(monkeypatch, tmp_path):
    monkeypatch.setenv("COURSEKIT_HUB_VENV", str(tmp_path))
    (tmp_path / "students").write_text("ada\n")
    monkeypatch.setenv("COURSEKIT_HUB_CLASS_LIST", str(tmp_path / "students"))
    with pytest.raises(ValueError, match=r"\.\[class\]"):
        runpy.run_path(str(CONFIG), init_globals={"get_config": Config})
