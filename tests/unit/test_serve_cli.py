"""``gpufold serve`` as a process on the embedded default: it says where the dashboard is, folds what is
posted (its processor thread), answers from its replica, and stops cleanly on SIGTERM."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

GPUFOLD = str(Path(sys.executable).with_name("gpufold"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_serve_on_the_embedded_log(tmp_path: Path) -> None:
    """Submit with ?wait, list the pod, open the page, then SIGTERM: it stops and the log holds the events."""
    port = free_port()
    log = tmp_path / "served.sqlite"
    server = subprocess.Popen(
        [GPUFOLD, "serve", "--log", str(log), "--port", str(port)], stderr=subprocess.PIPE, text=True
    )
    try:
        banner = [server.stderr.readline() for _ in range(2)]  # type: ignore[union-attr]
        assert f"open the dashboard at http://127.0.0.1:{port}/" in banner[1], banner
        assert "processor running in this process" in banner[0]
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            deadline = time.monotonic() + 30
            while True:
                try:
                    if client.get("/v1/replica").json()["ready"]:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "the server did not come up"
                time.sleep(0.1)
            node = {"node_id": "n1", "gpu_model": "A100", "gpu_count": 2, "cpu_milli": 8_000, "memory_mib": 16_384}
            assert client.post("/v1/clusters/lab/nodes?wait=10", json=node).json()["complete"]
            placed = client.post("/v1/clusters/lab/pods?wait=10", json={"pod_id": "p1", "num_gpu": 1}).json()
            assert placed["outcomes"][0]["kind"] == "PodScheduled"
            deadline = time.monotonic() + 10
            while client.get("/v1/pods").json()["total"] != 1:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            assert "gpufold dashboard" in client.get("/").text
            assert "gpufold_replica_lag_commands" in client.get("/metrics").text
    finally:
        server.send_signal(signal.SIGTERM)
        # uvicorn drains the requests, then re-raises the signal: the exit status says SIGTERM.
        assert server.wait(30) in (0, -signal.SIGTERM)
    assert subprocess.run([GPUFOLD, "log", "info", "--log", str(log)], capture_output=True, text=True).stdout.count(
        "2 events"
    ), "the processor thread did not commit the events"
