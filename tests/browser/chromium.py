"""Drive Debian's Chromium headless over the DevTools protocol on a pipe (no extra packages, no network).

Chromium is started as the machine notes say (as root: ``--no-sandbox``; no background networking,
no component updates, no sync, a fresh ``--user-data-dir``) with ``--remote-debugging-pipe``: it
reads protocol messages from fd 3 and writes them to fd 4, each a JSON object ended by a NUL byte.
``scripts/chromium.sh`` installs the package when it is missing (``make test`` runs it).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
)


def find_chromium() -> str | None:
    for candidate in (os.environ.get("GPUFOLD_CHROMIUM"), "/usr/bin/chromium", "/usr/bin/chromium-browser"):
        if candidate and Path(candidate).exists():
            return candidate
    return shutil.which("chromium")


class ProtocolError(RuntimeError):
    pass


class Chromium:
    """One headless browser with one page; ``evaluate`` JavaScript in it, ``screenshot`` it."""

    def __init__(self, binary: str, width: int = 1400, height: int = 1000, mobile: bool = False) -> None:
        self.profile = tempfile.mkdtemp(prefix="gpufold-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def fds() -> None:  # in the child: the protocol pipes on fds 3 and 4
            # Through fresh copies first: a pipe end may itself be fd 3 or 4, and dup2 onto itself
            # would neither move the other nor make it inheritable.
            reader, writer = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(reader, 3)
            os.dup2(writer, 4)

        self.process = subprocess.Popen(
            [binary, *FLAGS, f"--user-data-dir={self.profile}", f"--window-size={width},{height}",
             "--remote-debugging-pipe", "about:blank"],
            # os.pipe() fds are not inheritable and dup2's copies are, so only fds 3 and 4 reach the
            # browser (close_fds would close them: it runs after preexec_fn).
            preexec_fn=fds, close_fds=False,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )  # fmt: skip
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._next_id = 0
        self._buffer = b""
        self._lock = threading.Lock()
        self.session: str | None = None
        self.width, self.height, self.mobile = width, height, mobile

    def _send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None) -> int:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        return self._next_id

    def call(self, method: str, params: dict[str, Any] | None = None, timeout: float = 30.0, page: bool = True) -> Any:
        with self._lock:
            wanted = self._send(method, params, self.session if page else None)
            deadline = time.monotonic() + timeout
            while True:
                if time.monotonic() > deadline:
                    raise ProtocolError(f"{method}: no answer in {timeout} s")
                while b"\0" not in self._buffer:
                    chunk = os.read(self._from_browser, 1 << 20)
                    if not chunk:
                        raise ProtocolError(f"chromium exited: {self.process.stderr.read().decode()[-2000:]}")  # type: ignore[union-attr]
                    self._buffer += chunk
                raw, self._buffer = self._buffer.split(b"\0", 1)
                message = json.loads(raw)
                if message.get("id") == wanted:
                    if "error" in message:
                        raise ProtocolError(f"{method}: {message['error']}")
                    return message.get("result", {})

    def open(self, url: str) -> None:
        target = self.call("Target.createTarget", {"url": "about:blank"}, page=False)["targetId"]
        self.session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True}, page=False)[
            "sessionId"
        ]
        self.call("Page.enable")
        metrics = {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": self.mobile}
        self.call("Emulation.setDeviceMetricsOverride", metrics)
        self.call("Page.navigate", {"url": url})

    def evaluate(self, expression: str) -> Any:
        result = self.call("Runtime.evaluate", {"expression": expression, "returnByValue": True, "awaitPromise": True})
        if "exceptionDetails" in result:
            raise ProtocolError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0) -> Any:
        """Evaluate until the expression is truthy; returns its value."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                value = self.evaluate(expression)
            except ProtocolError:  # the page is still loading (no body yet, navigation in progress)
                value = None
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {expression}")
            time.sleep(0.1)

    def screenshot(self, path: Path, full_page: bool = True) -> Path:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            height = int(self.evaluate("document.documentElement.scrollHeight"))
            params["clip"] = {"x": 0, "y": 0, "width": self.width, "height": max(height, 200), "scale": 1}
            params["captureBeyondViewport"] = True
        data = self.call("Page.captureScreenshot", params)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        with contextlib.suppress(ProtocolError, OSError):
            self.call("Browser.close", page=False, timeout=5)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)
        for fd in (self._to_browser, self._from_browser):
            with contextlib.suppress(OSError):
                os.close(fd)
        shutil.rmtree(self.profile, ignore_errors=True)
