"""make test-gpu without a GPU, and its parts that need none: the report writer, the
training bench's CPU half and step breakdown, the GPU Python's install list."""

import importlib.util
import json
import os
import subprocess
import sys
import textwrap
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from coursekit.parallel.spans import Span

ROOT = Path(__file__).resolve().parent.parent
NO_GPU = ("no NVIDIA GPU visible: make test-gpu measures on a GPU; "
          "make test checks the GPU code in numba's simulator")


def load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


gpu_report = load("gpu_report")
training = load("bench_gpu_training")
gpu_env = load("gpu_env")


def fake_nvidia_smi(tmp_path, output: str, status: int) -> dict:
    """An environment whose nvidia-smi prints ``output`` and exits with ``status``."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    smi = bin_dir / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\nprintf '%s' '{output}'\nexit {status}\n")
    smi.chmod(0o755)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}


def make(env, *args):
    return subprocess.run(["make", "--no-print-directory", "-C", str(ROOT), *args], env=env,
                          capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("output, status", [("", 127), ("No devices were found\n", 6)],
                         ids=["no driver", "no device"])
@pytest.mark.parametrize("gpu_python", ["", "python3"])
def test_make_test_gpu_without_a_gpu_stops_at_once_with_the_message(tmp_path, output, status,
                                                                    gpu_python):
    env = fake_nvidia_smi(tmp_path, output, status)
    t0 = time.monotonic()
    done = make(env, "test-gpu", f"GPU_PYTHON={gpu_python}", f"VENV={tmp_path / 'venv'}",
                f"GPU_REPORT={tmp_path / 'report'}")
    assert done.returncode != 0
    assert NO_GPU in done.stderr
    assert time.monotonic() - t0 < 10
    assert not (tmp_path / "venv").exists() and not (tmp_path / "report").exists()


def test_with_a_gpu_listed_the_check_passes_and_the_run_uses_the_given_python(tmp_path):
    env = fake_nvidia_smi(tmp_path, "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)\n", 0)
    assert make(env, "gpu-check").returncode == 0
    plan = make(env, "-n", "test-gpu", "GPU_PYTHON=python3", "GPU_REPORT=/x/report").stdout
    assert "python3 bench/gpu_env.py --extra gpu" in plan
    assert "python3 bench/gpu_report.py --report /x/report --tests tests/nn/test_nn_cuda_sim.py" in plan
    assert "pip install" not in plan and "-m venv" not in plan
    assert gpu_report.gpus_visible(str(tmp_path / "bin" / "nvidia-smi")) == [
        "GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-0)"]


def test_the_report_runner_refuses_to_start_without_a_gpu(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gpu_report, "gpus_visible", lambda *a: [])
    assert gpu_report.main(["--report", str(tmp_path / "r")]) == 2
    assert NO_GPU in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def junit(path, cases):
    suite = ET.Element("testsuite")
    for name, outcome in cases:
        case = ET.SubElement(suite, "testcase", classname="tests.nn.test_nn_cuda_sim", name=name)
        if outcome:
            ET.SubElement(case, outcome, message="x")
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(path)


def test_report_writer_keeps_every_figure_in_json_and_markdown(tmp_path):
    junit(tmp_path / "j.xml", [("test_a", None), ("test_b", "failure"), ("test_c", "skipped"),
                               ("test_d", "error"), ("test_e", None)])
    tests = gpu_report.test_counts(tmp_path / "j.xml")
    assert (tests["passed"], tests["failed"], tests["skipped"], tests["errors"]) == (2, 1, 1, 1)
    assert tests["not_passed"] == [f"tests.nn.test_nn_cuda_sim::test_{x}" for x in "bcd"]
    row = {"net": "784-256-10", "sizes": [784, 256, 10], "batch_size": 256, "device": "cuda",
           "steps": 40, "workers": 4, "step_s": 0.004, "compute_s": 0.001, "stage_s": 0.0005,
           "comm_s": 0.002, "other_s": 0.0005, "stage_share": 0.125, "stage_spans": 160}
    report = {"machine": {"python": "3.12.3", "nvidia_smi": ["NVIDIA H100, 580.1, 81559 MiB"],
                          "packages": {"numba": "0.62"}},
              "steps": [{"step": "tests", "returncode": 1, "seconds": 3.5, "ok": False}],
              "tests": tests, "ok": False,
              "kernels": {"gpu": "H100", "rows": [{"config": "64-128-10 b32", "gpu_us": 41.5,
                                                    "cpu_us": 16.25, "nested": {"x": 1}}]},
              "training": {"engines": 4, "steps": 40, "gpus_used": [0], "rows": [row]}}
    js, md = gpu_report.write_report(tmp_path / "out", report)
    assert json.loads(js.read_text()) == report
    text = md.read_text()
    assert "NVIDIA H100, 580.1, 81559 MiB" in text and "result: FAILED" in text
    assert "2 passed, 1 failed, 1 errors, 1 skipped" in text
    assert "| config | gpu_us | cpu_us |" in text and "| 64-128-10 b32 | 41.5 | 16.25 |" in text
    assert "| 784-256-10 | 256 | cuda | 4.000 | 1.000 | 0.500 | 2.000 | 0.500 | 12.5 % |" in text
    assert "(not measured)" in gpu_report.render_markdown({**report, "kernels": None})


def test_the_step_breakdown_sums_the_spans_per_rank_over_the_timeline():
    # 2 ranks, 2 timeline steps (of 3 run); rank 1 computes longer, rank 0 waits longer
    spans = [Span(0, "compute", 0, 1), Span(0, "stage", 1, 1.5), Span(0, "comm", 1.5, 4),
             Span(0, "compute", 4, 5), Span(0, "stage", 5, 5.5), Span(0, "comm", 5.5, 8),
             Span(1, "forward", 0, 1), Span(1, "backward", 1, 2), Span(1, "stage", 2, 3),
             Span(1, "comm", 3, 4), Span(1, "compute", 4, 6), Span(1, "stage", 6, 7),
             Span(1, "comm", 7, 8), Span(1, "idle", 8, 8.5)]
    result = SimpleNamespace(config=SimpleNamespace(timeline_steps=2), n_workers=2, spans=spans,
                             step_s=np.array([[9.0, 4.0, 4.0], [9.0, 4.0, 4.5]]))
    b = training.breakdown(result)
    assert b["steps"] == 2 and b["stage_spans"] == 4
    assert b["step_s"] == pytest.approx(4.25)      # slowest rank per step, mean of the last 2
    assert b["compute_s"] == pytest.approx(2.0)    # rank 1: (2 + 2) / 2
    assert b["stage_s"] == pytest.approx(1.0)      # rank 1: (1 + 1) / 2
    assert b["comm_s"] == pytest.approx(1.0)       # the rank that waited least: rank 1
    assert b["other_s"] == pytest.approx(0.25)
    assert b["stage_share"] == pytest.approx(1.0 / 4.25)


@pytest.mark.slow  # compiles the step kernels when numba's cache is cold
def test_the_cpu_half_trains_on_ranks_and_reports_no_staging():
    from coursekit.cluster.runner import LocalRunner

    net = training.Net("tiny", (16, 8, 3), 16, "blobs")
    row = training.measure(LocalRunner(2), net, "cpu", 4, warmup=1,
                           data=training.load_data(net, rows=64))
    assert row["device"] == "cpu" and row["steps"] == 4 and row["workers"] == 2
    assert row["stage_s"] == 0 and row["stage_spans"] == 0 and row["stage_share"] == 0
    assert 0 < row["compute_s"] < row["step_s"] and row["comm_s"] > 0
    assert row["compute_s"] + row["comm_s"] + row["other_s"] == pytest.approx(row["step_s"])
    assert "| tiny | 16 | cpu |" in training.markdown([row])


def test_a_gpu_run_that_staged_nothing_is_refused(monkeypatch):
    fake = SimpleNamespace(config=SimpleNamespace(timeline_steps=1), n_workers=1,
                           spans=[Span(0, "compute", 0, 1)], step_s=np.array([[1.0]]),
                           devices=["cuda"])
    monkeypatch.setattr(training, "make_config", lambda *a, **k: None)
    monkeypatch.setattr("coursekit.parallel.data_parallel.train", lambda *a, **k: fake)
    with pytest.raises(RuntimeError, match="recorded no 'stage' span"):
        training.measure(None, training.NETS[1], "cuda", 1, data=(None, None))
    fake.devices = ["cpu"]
    with pytest.raises(RuntimeError, match="asked for device='cuda' but the ranks computed on"):
        training.measure(None, training.NETS[1], "cuda", 1, data=(None, None))


def test_the_cuda_half_says_why_it_cannot_run(monkeypatch, capsys):
    monkeypatch.setattr(training, "no_gpu_reason", lambda: "numba finds no usable CUDA GPU")
    assert training.main(["--devices", "cuda"]) == 2
    assert training.main(["--require-gpu"]) == 2
    err = capsys.readouterr().err
    assert err.count("cannot run the cuda half: numba finds no usable CUDA GPU") == 2
    assert "--devices cpu" in err


def test_no_gpu_reason_here():
    from numba import cuda

    reason = training.no_gpu_reason()
    if not cuda.is_available():
        assert reason == "numba finds no usable CUDA GPU"
    else:
        assert reason is None or "DPConfig has no `device` field" in reason


def test_the_gpu_python_gets_only_what_it_lacks(tmp_path, capsys):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(textwrap.dedent("""\
        [project]
        dependencies = ["numpy>=1.0", "numpy-from-the-future>=1", "pytest>=999", "jupyterlab>=4"]
        [project.optional-dependencies]
        test = ["pytest-timeout>=1", "nbval>=0.11", "hypothesis>=99999"]
        gpu = ["numba-cuda[cu12]>=0.20", "cupy-cuda12x[ctk]>=13.6"]
        """))
    wanted = gpu_env.missing("gpu", pyproject)
    assert "numpy>=1.0" not in wanted and "pytest-timeout>=1" not in wanted
    assert {"numpy-from-the-future>=1", "pytest>=999", "hypothesis>=99999"} <= set(wanted)
    assert not {"jupyterlab>=4", "nbval>=0.11"} & set(wanted)  # not needed by the GPU run
    assert ("cupy-cuda12x[ctk]>=13.6" in wanted) == (gpu_env.any_cupy() is None)
    assert ("numba-cuda[cu12]>=0.20" in wanted) == gpu_env.needs_numba_cuda()
    with pytest.raises(SystemExit, match="no extra 'gpu-cu13'; allowed: gpu"):
        gpu_env.missing("gpu-cu13", pyproject)
    assert gpu_env.satisfied("numpy>=1.0") and not gpu_env.satisfied("numpy>=999")
    assert gpu_env.satisfied("numpy<999") and not gpu_env.satisfied("numpy<1.0")


def test_the_numpy_cap_downgrades_only_a_numpy_that_numba_refuses(tmp_path, monkeypatch):
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_text(textwrap.dedent("""\
        [project]
        dependencies = []
        [project.optional-dependencies]
        test = []
        gpu = ["numpy<1.0"]
        """))
    assert gpu_env.numba_imports()  # this venv's Numba accepts its NumPy
    assert gpu_env.missing("gpu", pyproject) == []
    monkeypatch.setattr(gpu_env, "numba_imports", lambda: False)
    assert gpu_env.missing("gpu", pyproject) == ["numpy<1.0"]


def test_gpu_env_installs_coursekit_without_its_dependencies_first(capsys):
    assert gpu_env.main(["--dry-run"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("+ ")]
    assert lines[0].endswith("-m pip install --no-deps -e .")


def test_a_step_past_its_time_is_ended_and_reported(tmp_path):
    with open(tmp_path / "log", "w") as log:
        step = gpu_report.run_step("sleepy", [sys.executable, "-c", "print('up', flush=True); "
                                              "import time; time.sleep(60)"], log, timeout=2)
        fine = gpu_report.run_step("fine", [sys.executable, "-c", "print('ok')"], log, timeout=30)
    assert step["returncode"] == "timeout after 2 s" and not step["ok"] and step["seconds"] < 20
    assert fine["returncode"] == 0 and fine["ok"]
    assert "===== sleepy" in (tmp_path / "log").read_text() and "up\n" in (tmp_path / "log").read_text()
