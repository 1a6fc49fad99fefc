"""Every ``curl`` example of the README runs, in order, against a real ``gpufold serve``: it exits 0, answers the
status the README says (``# HTTP 409``; 2xx when it says none), and the output shown under it holds (every
``"key":value`` the README prints appears in the answer)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

REPO = Path(__file__).resolve().parents[2]
GPUFOLD = str(Path(sys.executable).with_name("gpufold"))
TOKEN = "readme-token"


def examples() -> list[tuple[str, str | None]]:
    """(command, the output line the README shows under it, if any) for each curl line of a code block."""
    found: list[tuple[str, str | None]] = []
    inside = False
    lines = (REPO / "README.md").read_text().splitlines()
    for index, line in enumerate(lines):
        if line.startswith("```"):
            inside = not inside
            continue
        command = line.removeprefix("$ ").strip()
        if inside and command.startswith("curl "):
            following = lines[index + 1] if index + 1 < len(lines) else ""
            shown = following if following.startswith("{") else None
            found.append((command, shown))
    return found


def pairs(value: Any, out: set[tuple[str, str]]) -> set[tuple[str, str]]:
    """Every (key, JSON of a scalar value) in a JSON document, at any depth."""
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(item, (dict, list)):
                out.add((key, json.dumps(item)))
            pairs(item, out)
    elif isinstance(value, list):
        for item in value:
            pairs(item, out)
    return out


def shown_pairs(shown: str) -> set[tuple[str, str]]:
    """The ``"key":value`` pairs of a README output line whose value is complete (no ellipsis)."""
    found = re.findall(r'"(\w+)":("(?:[^"\\…]|\\.)*"|-?\d+|true|false|null)(?=[,}])', shown)
    return {(key, value) for key, value in found}


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_the_readme_has_curl_examples() -> None:
    commands = [command for command, _ in examples()]
    assert len(commands) >= 7 and any("--json @one-command.json" in c for c in commands)
    assert not any(" -d " in c or "--data" in c for c in commands), "a form body: the API wants --json"


def test_every_readme_curl_example_runs(tmp_path: Path) -> None:
    curl = shutil.which("curl")
    if curl is None:
        pytest.fail("curl is not installed")
    port = free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith("GPUFOLD_")}
    environ["GPUFOLD_API_TOKEN"] = TOKEN
    server = subprocess.Popen(
        [GPUFOLD, "serve", "--create", "--log", str(tmp_path / "readme.sqlite"), "--port", str(port)],
        stderr=subprocess.DEVNULL, env=environ,
    )  # fmt: skip
    asked = {"cluster": "lab", "payload": {"SubmitPod": {"pod_id": "what-if-1", "num_gpu": 1, "gpu_milli": 1000}}}
    (tmp_path / "one-command.json").write_text(json.dumps(asked))
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/replica").json()["ready"]:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "serve did not come up"
            time.sleep(0.1)
        for command, shown in examples():
            status_comment = re.search(r"\s+#\s*HTTP (\d{3})\s*$", command)
            expected = int(status_comment.group(1)) if status_comment else None
            runnable = command[: status_comment.start()] if status_comment else command
            runnable = runnable.replace("localhost:8000", f"127.0.0.1:{port}")
            result = subprocess.run(
                ["bash", "-c", runnable + " -w '\\n%{http_code}'"],
                capture_output=True, text=True, timeout=60, cwd=tmp_path, env=environ,
            )  # fmt: skip
            assert result.returncode == 0, (command, result.stderr)
            body, _, status = result.stdout.rpartition("\n")
            if expected is None:
                assert status.startswith("2"), (command, status, body)
            else:
                assert int(status) == expected, (command, status, body)
            answer = json.loads(body)
            if shown is not None:
                missing = shown_pairs(shown) - pairs(answer, set())
                assert not missing, (command, missing, body)
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(30)
