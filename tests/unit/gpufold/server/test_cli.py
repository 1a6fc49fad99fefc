"""``gpufold serve`` as a process on the embedded default: it says where the dashboard is, folds what is
posted (its processor thread), answers from its replica, and stops cleanly on SIGTERM."""

from __future__ import annotations

import json
import os
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
    """Submit with ?wait, list the pod, see a time limit fire from the server's ticks, open the page, SIGTERM."""
    port = free_port()
    log = tmp_path / "served.sqlite"
    server = subprocess.Popen(
        [GPUFOLD, "serve", "--create", "--log", str(log), "--port", str(port), "--tick-interval", "0.2"],
        stderr=subprocess.PIPE,
        text=True,
        # --log wins over a Kafka address in the environment (as in `make test`, which exports one).
        env={
            **{k: v for k, v in os.environ.items() if k != "GPUFOLD_DATABASE_URL"},
            "GPUFOLD_KAFKA_BOOTSTRAP": "127.0.0.1:1",
        },
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
            assert client.post("/v1/clusters/lab/nodes?wait=10&create_cluster=true", json=node).json()["complete"]
            placed = client.post("/v1/clusters/lab/pods?wait=10", json={"pod_id": "p1", "num_gpu": 1}).json()
            assert placed["outcomes"][0]["kind"] == "PodScheduled"
            deadline = time.monotonic() + 10
            while client.get("/v1/pods").json()["total"] != 1:
                assert time.monotonic() < deadline
                time.sleep(0.05)
            # A time limit fires from the server's own ticks, with no other command.
            limited = {"pod_id": "p2", "num_gpu": 1, "time_limit_ms": 300}
            assert client.post("/v1/clusters/lab/pods?wait=10", json=limited).json()["complete"]
            deadline = time.monotonic() + 15
            while client.get("/v1/pods", params={"cluster": "lab"}).json()["total"] != 1:
                assert time.monotonic() < deadline, "the time limit did not fire"
                time.sleep(0.1)
            # The replica folds the log as it is appended; health says when the processor committed it too,
            # in a sample taken after the time limit fired (an older one may predate the tick that fired it).
            fired = time.time()
            deadline = time.monotonic() + 15
            while True:
                status = client.get("/v1/status").json()
                if (status["checked_at"] or 0) > fired and not any(
                    p["lag_commands"] for p in status["fold"]["partitions"]
                ):
                    break
                assert time.monotonic() < deadline, "the processor did not catch up"
                time.sleep(0.1)
            assert "gpufold dashboard" in client.get("/").text
            assert "gpufold_replica_lag_commands" in client.get("/metrics").text
    finally:
        server.send_signal(signal.SIGTERM)
        # uvicorn drains the requests, then re-raises the signal: the exit status says SIGTERM.
        assert server.wait(30) in (0, -signal.SIGTERM)
    info = subprocess.run([GPUFOLD, "log", "info", "--log", str(log), "--json"], capture_output=True, text=True)
    events = json.loads(info.stdout)["partitions"][0]["events"]
    assert events >= 5, "the processor thread did not commit the events"  # node, 2 pods, time limit, release
