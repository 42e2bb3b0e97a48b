"""``make test-gpu``'s runner: the GPU tests, the kernel bench and the training bench on a
real GPU, then every figure in one JSON and one markdown report.

    python bench/gpu_report.py --report DIR [--tests tests/nn/test_nn_cuda_sim.py ...]

Steps, each in its own process, its output shown and kept in DIR/gpu.log:

1. ``tests``: pytest on the CUDA tests with ``COURSEKIT_CUDA_TESTS=device`` (the
   simulator's equality tests, run on the hardware; ``NUMBA_ENABLE_CUDASIM`` unset);
2. ``kernels``: ``bench/bench_gpu_kernels.py --require-gpu --json DIR/kernels.json``;
3. ``training``: ``bench/bench_gpu_training.py --require-gpu --json DIR/training.json``.

Then DIR/gpu.json holds the machine (GPU, driver, package versions), each step's exit
status and seconds, the test counts and both benches' JSON, and DIR/gpu.md the same as
tables. Every step runs even when an earlier one failed (one device session measures
everything it can); the exit status is 1 when any step failed. Five files in all, so the
report fits what a borrowed machine sends back.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_TESTS = ["tests/nn/test_nn_cuda_sim.py", "tests/parallel/data_parallel/test_data_parallel_cuda_sim.py",
                 "tests/parallel/test_model_parallel_cuda_sim.py"]
PACKAGES = ("numpy", "numba", "numba-cuda", "llvmlite", "cupy-cuda12x", "cupy-cuda13x", "cupy",
            "ipyparallel", "pyzmq", "torch")
NO_GPU = ("no NVIDIA GPU visible: make test-gpu measures on a GPU; "
          "make test checks the GPU code in numba's simulator")


def gpus_visible(nvidia_smi: str = "nvidia-smi") -> list[str]:
    """The GPUs ``nvidia-smi -L`` lists ("GPU 0: ..." lines); [] without a driver or GPU."""
    try:
        out = subprocess.run([nvidia_smi, "-L"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in out.stdout.splitlines() if line.startswith("GPU ")]


def machine_info() -> dict:
    """The GPU(s), driver and package versions of this run."""
    from importlib import metadata

    info = {"python": platform.python_version(), "platform": platform.platform(),
            "cpus": os.cpu_count(), "gpus": gpus_visible(), "packages": {}}
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=30)
        info["nvidia_smi"] = [line.strip() for line in q.stdout.splitlines() if line.strip()]
    except (OSError, subprocess.TimeoutExpired):
        info["nvidia_smi"] = []
    for name in PACKAGES:
        try:
            info["packages"][name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return info


def test_counts(junit_xml: Path) -> dict:
    """passed / failed / errors / skipped and the names of what did not pass, from pytest's
    JUnit XML (all zero when the file is missing: pytest did not get that far)."""
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "not_passed": []}
    if not junit_xml.exists():
        return counts
    for case in ET.parse(junit_xml).getroot().iter("testcase"):
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        if case.find("failure") is not None:
            counts["failed"] += 1
            counts["not_passed"].append(name)
        elif case.find("error") is not None:
            counts["errors"] += 1
            counts["not_passed"].append(name)
        elif case.find("skipped") is not None:
            counts["skipped"] += 1
            counts["not_passed"].append(name)
        else:
            counts["passed"] += 1
    return counts


def run_step(name: str, cmd: list[str], log, *, env: dict | None = None, timeout: float) -> dict:
    """Run one step, its output echoed and appended to ``log``; its status and seconds."""
    header = f"\n===== {name}: {' '.join(cmd)}\n"
    print(header, end="", flush=True)
    log.write(header)
    t0 = time.perf_counter()
    try:
        # its own process group, so that a step past its time ends with its cluster's engines
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    except OSError as e:
        rc = f"{type(e).__name__}: {e}"
    else:
        def pump():
            for line in proc.stdout:
                sys.stdout.write(line)
                log.write(line)

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        try:
            rc = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait()
            rc = f"timeout after {timeout:g} s"
        reader.join(timeout=10)
    sys.stdout.flush()
    log.flush()
    return {"step": name, "command": cmd, "returncode": rc, "ok": rc == 0,
            "seconds": round(time.perf_counter() - t0, 2)}


def _fmt(v) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, (list, tuple)):
        return "-".join(map(str, v)) if all(isinstance(x, int) for x in v) else json.dumps(v)
    return str(v)


def table(rows: list[dict]) -> str:
    """A list of flat dicts as a markdown table (columns: the keys in first-seen order)."""
    if not rows:
        return "(no rows)\n"
    keys: list[str] = []
    for r in rows:
        keys += [k for k in r if k not in keys]
    out = "| " + " | ".join(keys) + " |\n|" + "---|" * len(keys) + "\n"
    for r in rows:
        out += "| " + " | ".join(_fmt(r.get(k, "")) for k in keys) + " |\n"
    return out


def bench_markdown(data) -> str:
    """Any bench's JSON as markdown: each list of dicts (at any depth) as a table under its
    key, the other values as a list."""
    if data is None:
        return "(not measured)\n"
    tables, scalars = [], []

    def walk(value, path):
        if isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            tables.append((path, value))
        elif isinstance(value, dict):
            for k, v in value.items():
                walk(v, f"{path}.{k}" if path else str(k))
        else:
            scalars.append((path, value))

    walk(data, "")
    out = "".join(f"- {k}: {_fmt(v)}\n" for k, v in scalars)
    for path, rows in tables:
        flat = [{k: v for k, v in r.items() if not isinstance(v, (dict, list))
                 or (isinstance(v, list) and all(isinstance(x, int) for x in v))} for r in rows]
        out += f"\n{path}:\n\n" + table(flat)
    return out


def training_markdown(data) -> str:
    """The training bench's rows as its own table (ms per step, stage share)."""
    if not data or "rows" not in data:
        return "(not measured)\n"
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        from bench_gpu_training import markdown
    finally:
        sys.path.pop(0)
    return (f"{data.get('engines')} engines sharing the GPU(s) {data.get('gpus_used')}, "
            f"{data.get('steps')} timed steps per run:\n\n" + markdown(data["rows"]))


def render_markdown(report: dict) -> str:
    """The whole report as markdown."""
    m = report["machine"]
    lines = ["# make test-gpu report", "",
             f"- GPU(s): {'; '.join(m.get('nvidia_smi') or m.get('gpus') or ['none'])}",
             f"- Python {m.get('python')} on {m.get('platform')}, {m.get('cpus')} CPUs",
             "- packages: " + ", ".join(f"{k} {v}" for k, v in m.get("packages", {}).items()),
             f"- result: {'PASSED' if report['ok'] else 'FAILED'}", "",
             "## Steps", "", table([{k: s[k] for k in ("step", "returncode", "seconds")}
                                    for s in report["steps"]]), "",
             "## GPU tests (COURSEKIT_CUDA_TESTS=device)", ""]
    t = report["tests"]
    lines.append(f"{t['passed']} passed, {t['failed']} failed, {t['errors']} errors, "
                 f"{t['skipped']} skipped")
    lines += [f"- not passed: {n}" for n in t["not_passed"]]
    lines += ["", "## Kernels (bench/bench_gpu_kernels.py)", "", bench_markdown(report["kernels"]),
              "", "## Data-parallel training (bench/bench_gpu_training.py)", "",
              training_markdown(report["training"])]
    return "\n".join(lines).rstrip() + "\n"


def write_report(report_dir: Path, report: dict) -> tuple[Path, Path]:
    """DIR/gpu.json and DIR/gpu.md."""
    report_dir.mkdir(parents=True, exist_ok=True)
    js, md = report_dir / "gpu.json", report_dir / "gpu.md"
    js.write_text(json.dumps(report, indent=2, default=str) + "\n")
    md.write_text(render_markdown(report))
    return js, md


def _load(path: Path):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", default="artifacts/gpu", help="folder of the report")
    parser.add_argument("--tests", nargs="+", default=DEFAULT_TESTS,
                        help="pytest paths run on the GPU with COURSEKIT_CUDA_TESTS=device")
    parser.add_argument("--steps", type=int, default=40, help="timed steps per training run")
    parser.add_argument("--timeout", type=float, default=240, help="seconds per step at most")
    args = parser.parse_args(argv)

    if not gpus_visible():
        print(NO_GPU, file=sys.stderr)
        return 2
    report_dir = Path(args.report).resolve()
    report_dir.mkdir(parents=True, exist_ok=True)
    py = sys.executable
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_ENABLE_CUDASIM"}
    env["COURSEKIT_CUDA_TESTS"] = "device"
    env.setdefault("PYTHONUNBUFFERED", "1")
    steps = []
    with open(report_dir / "gpu.log", "w") as log, tempfile.TemporaryDirectory() as tmp:
        junit = Path(tmp) / "pytest.xml"
        steps.append(run_step("tests", [py, "-m", "pytest", "-v", "-p", "no:cacheprovider",
                                        f"--junitxml={junit}", *args.tests],
                              log, env=env, timeout=args.timeout))
        tests = test_counts(junit)
        steps.append(run_step("kernels", [py, "bench/bench_gpu_kernels.py", "--require-gpu",
                                          "--json", str(report_dir / "kernels.json")],
                              log, env=env, timeout=args.timeout))
        steps.append(run_step("training", [py, "bench/bench_gpu_training.py", "--require-gpu",
                                           "--steps", str(args.steps),
                                           "--json", str(report_dir / "training.json")],
                              log, env=env, timeout=args.timeout))
    if tests["passed"] == 0 and steps[0]["ok"]:  # a run that collected nothing proves nothing
        steps[0]["ok"], steps[0]["returncode"] = False, "no test ran"
    report = {"machine": machine_info(), "steps": steps, "tests": tests,
              "kernels": _load(report_dir / "kernels.json"),
              "training": _load(report_dir / "training.json")}
    report["ok"] = all(s["ok"] for s in steps)
    js, md = write_report(report_dir, report)
    print(f"\n{md.read_text()}\nreport: {js} and {md}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
