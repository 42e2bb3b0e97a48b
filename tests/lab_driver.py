"""Drive a real JupyterLab in a real headless Chromium, as a student would.

The lab is started with the README's own command (``make lab``) on a free
loopback port, with temporary runtime, settings, checkpoint and working-copy folders
(``make lab`` copies the course's notebooks into the working copy; autosave is off). The browser is Debian's
Chromium driven by Playwright; no browser is downloaded.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings": {"fetchNews": "false"},
    # render every cell (JupyterLab 4 otherwise keeps only the visible ones in the page)
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Lab:
    """``make lab`` in the background; ``url(path)`` gives an authenticated link."""

    def __init__(self, repo: Path, workdir: Path, timeout: float = 90):
        settings = workdir / "settings"
        for name, values in LAB_SETTINGS.items():
            (settings / name).parent.mkdir(parents=True, exist_ok=True)
            (settings / name).write_text(json.dumps(values))
        self.port = free_port()
        self.log_path = workdir / "lab.log"
        # the kernels and their clusters inherit an IPYTHONDIR of their own: the test
        # finds every cluster process the course left (coursekit.cluster.processes)
        self.ipython_dir = workdir / "ipython"
        env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(workdir / "runtime"),
                   IPYTHONDIR=str(self.ipython_dir),
                   JUPYTERLAB_SETTINGS_DIR=str(settings), JUPYTERLAB_WORKSPACES_DIR=str(workdir / "ws"))
        # the student's working copy, made afresh by `make lab` (never a stale one of the checkout's)
        self.workspace = workdir / "workspace"
        self.process = subprocess.Popen(
            ["make", "lab", f"PORT={self.port}", f"WORKSPACE={self.workspace}",
             # checkpoints JupyterLab makes on opening go to the temp dir, not the course
             f"LAB_ARGS=--no-browser --FileCheckpoints.checkpoint_dir={workdir / 'checkpoints'}"],
            cwd=repo, env=env, stdout=self.log_path.open("w"), stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self.token = self._wait_for_token(timeout)

    def _wait_for_token(self, timeout: float) -> str:
        """The token of the server's printed link, once the server answers with it (jupyter
        prints the link before it checks the file to run, and may exit right after)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = re.search(rf"127\.0\.0\.1:{self.port}/lab[^?\s]*\?token=([0-9a-f]+)", self.log())
            if found and self._answers(found.group(1)):
                return found.group(1)
            if self.process.poll() is not None:
                break
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"`make lab` did not start within {timeout} s:\n{self.log()[-3000:]}")

    def _answers(self, token: str) -> bool:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/api/status",
                                         headers={"Authorization": f"token {token}"})
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return response.status == 200
        except OSError:  # not listening yet, or gone
            return False

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def url(self, path: str = "") -> str:
        """``path`` opened in a fresh workspace (``reset``: no tab of an earlier visit comes
        back and starts a kernel)."""
        return f"http://127.0.0.1:{self.port}/lab/tree/{path}?reset&token={self.token}"

    def kernels(self, retry_s: float = 0) -> list[dict]:
        """The kernels the server runs now (its REST API). With ``retry_s``, an HTTP 500 is
        asked again for up to that long: listing while a kernel shuts down can fail (seen once,
        right after the previous test shut its kernel down)."""
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}/api/kernels",
                                         headers={"Authorization": f"token {self.token}"})
        deadline = time.monotonic() + retry_s
        while True:
            try:
                with urllib.request.urlopen(request, timeout=10) as response:
                    return json.load(response)
            except urllib.error.HTTPError as error:
                if error.code != 500 or time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def shut_down_kernels(self) -> list[str]:
        """Shut down every kernel the server runs (after a failed test); return their ids."""
        ids = [k["id"] for k in self.kernels()]
        for kernel_id in ids:
            request = urllib.request.Request(
                f"http://127.0.0.1:{self.port}/api/kernels/{kernel_id}", method="DELETE",
                headers={"Authorization": f"token {self.token}"})
            urllib.request.urlopen(request, timeout=30).close()
        return ids

    def stop(self) -> None:
        """SIGTERM the whole session (make, jupyter, kernels); kill it if it lingers."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=10)


def menu(page, *names: str) -> None:
    """Click through the main menu: ``menu(page, "Run", "Run All Cells")``."""
    page.locator("#jp-MainMenu").get_by_role("menuitem", name=names[0], exact=True).click()
    for name in names[1:]:
        page.get_by_role("menuitem", name=re.compile(rf"^{re.escape(name)}")).first.click()


def open_notebook(page, lab: Lab, path: str, timeout_ms: int = 60_000) -> None:
    page.goto(lab.url(path))
    page.locator(".jp-Notebook .jp-Cell").first.wait_for(timeout=timeout_ms)
    # the indicator reads "idle" before the session has a kernel at all: wait for the
    # server to run one, or Run All Cells may meet "Select Kernel" instead
    deadline = time.monotonic() + timeout_ms / 1000
    while not any(k["execution_state"] == "idle" for k in lab.kernels(retry_s=10)):
        if time.monotonic() > deadline:
            raise AssertionError(f"no idle kernel {timeout_ms / 1000:.0f} s after opening {path}: "
                                 f"{lab.kernels(retry_s=10)}")
        page.wait_for_timeout(100)
    wait_for_kernel_idle(page, timeout_ms)


def wait_for_kernel_idle(page, timeout_ms: int) -> None:
    page.wait_for_function(
        """() => {
            const status = document.querySelector('.jp-Notebook-ExecutionIndicator');
            return status && status.getAttribute('data-status') === 'idle';
        }""",
        timeout=timeout_ms,
    )


def run_all_cells(page, timeout_ms: int = 120_000, attempts: int = 3) -> None:
    """Clear every output, run every cell, wait until none is queued or running.

    Run All Cells can be lost like Clear Outputs (seen once under load in CI: the notebook
    stayed cleared and idle for 180 s). Once clicked, every cell's prompt turns to [*] or a
    number at once, before the kernel runs anything; while none has, it is clicked again.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    clear_all_outputs(page)
    for attempt in range(attempts):
        menu(page, "Run", "Run All Cells")
        try:
            page.wait_for_function(
                """() => [...document.querySelectorAll('.jp-InputArea-prompt')]
                          .some(p => /\\[(\\*|\\d+)\\]/.test(p.textContent))""",
                timeout=15_000)
            break
        except PlaywrightTimeout:
            if attempt == attempts - 1:
                raise AssertionError(f"Run All Cells queued no cell in {attempts} tries; "
                                     + describe_execution(page)) from None
            answer_kernel_dialog(page)
            page.locator(".jp-Notebook .jp-Cell .jp-InputPrompt").first.click()
    wait_until_executed(page, timeout_ms)


def answer_kernel_dialog(page) -> None:
    """Accept JupyterLab's "Select Kernel" dialog if it is open; fail on any other dialog.

    Running a cell while the session has no kernel yet (its start was slow, seen once in CI
    under load) opens "Select Kernel" over the notebook, and nothing runs until it is
    answered; its accept button starts the notebook's own kernel. Any other dialog is not
    expected here, so its text becomes the failure.
    """
    dialog = page.locator(".jp-Dialog")
    if not dialog.count() or not dialog.first.is_visible():
        return
    text = dialog.first.inner_text()
    if "Select Kernel" not in text:
        raise AssertionError(f"an unexpected dialog blocks the notebook: {text!r}")
    dialog.first.locator(".jp-mod-accept").click()
    dialog.first.wait_for(state="detached", timeout=10_000)


def clear_all_outputs(page, attempts: int = 4) -> None:
    """Edit > Clear Outputs of All Cells, until no output is left.

    Right after a notebook opens, JupyterLab may not have made it the current widget yet
    and the menu command then does nothing; focusing a cell and trying again fixes that.
    """
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    for attempt in range(attempts):
        page.locator(".jp-Notebook .jp-Cell .jp-InputPrompt").first.click()
        menu(page, "Edit", "Clear Outputs of All Cells")
        try:
            page.wait_for_function(
                "() => document.querySelectorAll('.jp-OutputArea-output').length === 0",
                timeout=10_000)
            return
        except PlaywrightTimeout:
            if attempt == attempts - 1:
                raise


def wait_until_executed(page, timeout_ms: int) -> None:
    """No cell queued or running, the kernel idle, some output shown; on a timeout, an
    AssertionError saying which cells were still queued or running and what they showed."""
    from playwright.sync_api import TimeoutError as PlaywrightTimeout

    try:
        page.wait_for_function(
            """() => {
                const prompts = [...document.querySelectorAll('.jp-InputArea-prompt')];
                const status = document.querySelector('.jp-Notebook-ExecutionIndicator');
                return prompts.length > 0 && prompts.every(p => !p.textContent.includes('*'))
                    && status && status.getAttribute('data-status') === 'idle'
                    && document.querySelectorAll('.jp-OutputArea-output').length > 0;
            }""",
            timeout=timeout_ms,
        )
    except PlaywrightTimeout:
        raise AssertionError(f"the notebook did not finish within {timeout_ms / 1000:.0f} s; "
                             + describe_execution(page)) from None


def describe_execution(page) -> str:
    """The execution indicator's status, and every cell still queued or running ([*]) with
    the start of its code and the end of its output."""
    return page.evaluate(
        """() => {
            const status = document.querySelector('.jp-Notebook-ExecutionIndicator');
            const busy = [...document.querySelectorAll('.jp-CodeCell')].map((cell, i) => {
                const prompt = cell.querySelector('.jp-InputArea-prompt');
                if (!prompt || !prompt.textContent.includes('*')) return null;
                const code = cell.querySelector('.jp-InputArea-editor').innerText.slice(0, 120);
                const out = cell.querySelector('.jp-OutputArea');
                return `code cell ${i} ${prompt.textContent.trim()}: ${JSON.stringify(code)}`
                    + ` output ends ${JSON.stringify(out ? out.innerText.slice(-300) : '')}`;
            }).filter(x => x);
            const prompts = document.querySelectorAll('.jp-InputArea-prompt').length;
            const outputs = document.querySelectorAll('.jp-OutputArea-output').length;
            return `indicator ${status ? status.getAttribute('data-status') : 'missing'}; `
                + `${prompts} prompt(s) and ${outputs} output(s) shown; `
                + `${busy.length} cell(s) queued or running:\\n` + busy.join('\\n');
        }""")


def shut_down_kernel(page, lab: Lab, timeout: float = 30) -> None:
    """Kernel > Shut Down Kernel (confirming if asked); wait until the server has no kernel."""
    menu(page, "Kernel", "Shut Down Kernel")
    accept = page.locator(".jp-Dialog .jp-mod-accept")  # JupyterLab 4 asks nothing; others may
    deadline = time.monotonic() + timeout
    while lab.kernels():
        if time.monotonic() > deadline:
            raise RuntimeError(f"kernels still running {timeout} s after Shut Down Kernel")
        if accept.is_visible():
            accept.click()
        page.wait_for_timeout(100)


def error_outputs(page) -> list[str]:
    """Texts of outputs that show an exception (tracebacks render as stderr)."""
    texts = page.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]').all_inner_texts()
    return [t for t in texts if "Traceback" in t or re.search(r"\b\w+Error\b", t)]
