"""Drive a JupyterHub the way a student's browser does, but from a test: log in, spawn the
server, run a notebook's code in a kernel of that server, stop it.

Only the public REST APIs are used (the hub's ``/hub/api`` and the Jupyter server's
``/user/NAME/api`` behind the hub's proxy) and the kernel websocket with the Jupyter
messaging protocol (JSON frames, ``execute_request`` -> ``execute_reply``), so what passes
here passes for a student whose JupyterLab talks to the same endpoints. Every wait has a
deadline: a server that never starts or a kernel that dies fails the test, never hangs it.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
import uuid

import nbformat


class HubError(RuntimeError):
    """The hub or a student's server answered something other than what a student expects."""


def request(url: str, method: str = "GET", *, token: str | None = None, body=None,
            timeout: float = 30.0):
    """One JSON request; returns the decoded answer (None when empty)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method)
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"token {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as answer:
            text = answer.read()
    except urllib.error.HTTPError as exc:
        raise HubError(f"{method} {url}: HTTP {exc.code} {exc.read()[:500]!r}") from None
    return json.loads(text) if text.strip() else None


class Student:
    """One student of the hub at ``base`` (``http://127.0.0.1:PORT``)."""

    def __init__(self, base: str, name: str):
        self.base, self.name, self.token = base.rstrip("/"), name, None

    def login(self, password: str) -> None:
        """A token for this student from their own user name and password."""
        answer = request(f"{self.base}/hub/api/users/{self.name}/tokens", "POST",
                         body={"auth": {"username": self.name, "password": password},
                               "note": "coursekit test"})
        self.token = answer["token"]

    def model(self) -> dict:
        return request(f"{self.base}/hub/api/users/{self.name}", token=self.token)

    def spawn(self, timeout: float) -> None:
        """Ask for the server and wait until the hub says it is ready."""
        request(f"{self.base}/hub/api/users/{self.name}/server", "POST", token=self.token, body={})
        self._wait(lambda server: server is not None and server.get("ready"), timeout, "ready")

    def stop(self, timeout: float) -> None:
        """Stop the server and wait until the hub has forgotten it."""
        try:
            request(f"{self.base}/hub/api/users/{self.name}/server", "DELETE", token=self.token)
        except HubError as exc:
            if "HTTP 400" not in str(exc):  # 400: no server running (already stopped)
                raise
        self._wait(lambda server: server is None, timeout, "stopped")

    def _wait(self, done, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while True:
            server = self.model().get("servers", {}).get("")
            if done(server):
                return
            if time.monotonic() > deadline:
                raise HubError(f"{self.name}'s server not {what} after {timeout:.0f} s: {server}")
            time.sleep(1.0)

    def api(self, path: str, method: str = "GET", body=None):
        """The Jupyter server REST API of this student's server, through the proxy."""
        return request(f"{self.base}/user/{self.name}/api/{path}", method, token=self.token,
                       body=body)

    def run_notebook(self, path, extra: str = "", timeout: float = 600.0) -> str:
        """Run every code cell of the notebook at ``path``, then ``extra``, in a new kernel
        of this student's server; raise HubError naming the first failing cell. Returns the
        ``text/plain`` result of ``extra``."""
        nb = nbformat.read(str(path), as_version=4)
        cells = ["".join(cell.source) for cell in nb.cells if cell.cell_type == "code"]
        kernel = self.api("kernels", "POST", {"name": "python3"})
        try:
            return asyncio.run(asyncio.wait_for(
                self._execute(kernel["id"], cells + ([extra] if extra else [])), timeout))
        finally:
            self.api(f"kernels/{kernel['id']}", "DELETE")

    async def _execute(self, kernel_id: str, cells: list[str]) -> str:
        from tornado.httpclient import HTTPRequest
        from tornado.websocket import websocket_connect

        url = f"{self.base.replace('http', 'ws', 1)}/user/{self.name}/api/kernels/{kernel_id}/channels"
        ws = await websocket_connect(HTTPRequest(url, headers={"Authorization": f"token {self.token}"},
                                                 connect_timeout=30, request_timeout=30))
        session, result = uuid.uuid4().hex, ""
        try:
            for number, code in enumerate(cells):
                msg_id = uuid.uuid4().hex
                ws.write_message(json.dumps({
                    "header": {"msg_id": msg_id, "msg_type": "execute_request", "session": session,
                               "username": self.name, "version": "5.3", "date": ""},
                    "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
                    "content": {"code": code, "silent": False, "store_history": True,
                                "user_expressions": {}, "allow_stdin": False,
                                "stop_on_error": True}}))
                reply, idle, result = None, False, ""
                while reply is None or not idle:  # the reply and every output, in any order
                    frame = await ws.read_message()
                    if frame is None:
                        raise HubError(f"kernel websocket closed during cell {number}:\n{code}")
                    msg = json.loads(frame)
                    if msg.get("parent_header", {}).get("msg_id") != msg_id:
                        continue
                    kind, content = msg["msg_type"], msg["content"]
                    if kind == "execute_reply":
                        reply = content
                    elif kind == "status" and content["execution_state"] == "idle":
                        idle = True
                    elif kind == "execute_result":
                        result = content["data"].get("text/plain", "")
                if reply["status"] != "ok":
                    raise HubError(f"cell {number} failed: {reply.get('ename')}: "
                                   f"{reply.get('evalue')}\n{code}")
        finally:
            ws.close()
        return result
