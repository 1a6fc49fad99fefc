"""A served log's numbers match ``gpufold state`` within a second of a write: the projection's utilization and
command outcomes (projected in the server), /metrics (from the replica), the replica's clusters, and one
fragmentation figure everywhere."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import create_engine

from gpufold.cli_commands._embedded import committed_states
from gpufold.state_view import summary as summary_of
from gpufold.state_view import utilization
from logs.embedded import EmbeddedLog
from projections.schema import ensure_schema

GPUFOLD = str(Path(sys.executable).with_name("gpufold"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def gpufold(*args: str) -> Any:
    result = subprocess.run([GPUFOLD, *args], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


class Serve:
    def __init__(self, tmp_path: Path) -> None:
        self.log = tmp_path / "served.sqlite"
        database = f"sqlite:///{tmp_path / 'projection.sqlite'}"
        environ = {k: v for k, v in os.environ.items() if not k.startswith("GPUFOLD_")}
        EmbeddedLog(self.log).close()
        engine = create_engine(database)
        ensure_schema(engine)  # what `gpufold projector run --create` makes
        engine.dispose()
        self.port = free_port()
        self.process = subprocess.Popen(
            [GPUFOLD, "serve", "--log", str(self.log), "--database-url", database, "--port", str(self.port)],
            stderr=subprocess.PIPE, text=True, env=environ,
        )  # fmt: skip
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{self.port}", timeout=30)
        deadline = time.monotonic() + 30
        while True:
            try:
                if self.client.get("/v1/replica").json()["ready"]:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "the server did not come up"
            time.sleep(0.1)

    def close(self) -> None:
        self.client.close()
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(30)


@pytest.fixture()
def serve(tmp_path: Path) -> Iterator[Serve]:
    running = Serve(tmp_path)
    yield running
    running.close()


def within_a_second(check: Callable[[], Any], since: float) -> float:
    """Seconds from ``since`` until ``check()`` passes (it raises AssertionError until then); at most one."""
    while True:
        try:
            check()
            took = time.monotonic() - since
            assert took <= 1.0, f"the numbers matched only after {took:.2f} s"
            return took
        except AssertionError:
            if time.monotonic() - since > 1.0:
                raise
            time.sleep(0.02)


def metric(text: str, name: str, **labels: str) -> float:
    wanted = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in text.splitlines():
        match = re.fullmatch(rf"{name}\{{(.*)\}} (\S+)", line)
        if match and ",".join(sorted(match.group(1).split(","))) == wanted:
            return float(match.group(2))
    raise AssertionError(f"no {name}{{{wanted}}}")


def test_served_numbers_follow_the_log_within_a_second(serve: Serve) -> None:
    client = serve.client
    nodes = [
        {"command_id": f"n{i}", "cluster": "lab", "payload": {"AddNode": {"node_id": f"n{i}", "gpu_model": model,
         "gpu_count": 4, "cpu_milli": 64_000, "memory_mib": 262_144}}}
        for i, model in enumerate(["A100", "A100", "T4"])
    ]  # fmt: skip
    assert client.post("/v1/commands?wait=10&create_cluster=true", json=nodes).status_code == 200
    pods = [
        {"command_id": f"s{i}", "cluster": "lab", "payload": {"SubmitPod": {"pod_id": f"p{i}", "tenant": f"t{i % 3}",
         "num_gpu": 1 if i % 4 else 2, "gpu_milli": 1000 if i % 3 else 500 if i % 4 else 1000, "cpu_milli": 1000}}}
        for i in range(20)
    ]  # fmt: skip
    written = client.post("/v1/commands?wait=10", json=pods)
    assert written.status_code == 200, written.text
    released = client.post("/v1/clusters/lab/pods/p3/release?wait=10", json={})
    assert released.status_code == 200

    written_at = time.monotonic()
    with EmbeddedLog(serve.log, readonly=True) as log:  # what `gpufold state` prints, computed here (fast)
        states = committed_states(log)
    state, summary = utilization(states), summary_of(states)["clusters"][0]

    def matches() -> None:
        projected = {r["gpu_model"]: r for r in client.get("/v1/utilization", params={"by": "model"}).json()}
        metrics = client.get("/metrics").text
        for row in state:
            model = row["gpu_model"]
            assert projected[model]["allocated_gpus"] == row["gpu_milli_allocated"] / 1000, model
            assert projected[model]["capacity_gpus"] == row["gpu_milli_capacity"] / 1000, model
            allocated = metric(metrics, "gpufold_gpus_allocated", cluster="lab", gpu_model=model)
            assert allocated == row["gpu_milli_allocated"] / 1000, model
        (live,) = client.get("/v1/clusters").json()["clusters"]
        assert (live["running"], live["pending"]) == (summary["pods_running"], summary["pods_queued"])
        assert live["gpu_milli_allocated"] == summary["gpu_milli_allocated"]
        assert metric(metrics, "gpufold_pending_pods", cluster="lab") == summary["pods_queued"]
        outcome = client.get("/v1/commands/s5")
        assert outcome.status_code == 200 and outcome.json()["outcome"] == "accepted"
        fragmentation = client.get("/v1/fragmentation", params={"cluster": "lab"}).json()
        assert abs(fragmentation["fragmentation_pct"] - live["fragmentation_pct"]) < 0.002
        history = client.get("/v1/clusters/lab/history").json()["points"]
        assert history[-1]["gpu_milli_allocated"] == summary["gpu_milli_allocated"]
        assert history[-1]["fragmentation_pct"] == live["fragmentation_pct"]
        assert history[0]["t"] > 1_000_000_000_000  # event time, not 1970

    within_a_second(matches, written_at)
    # The CLI prints the same numbers as the functions used above.
    assert gpufold("state", "utilization", "--log", str(serve.log), "--json") == state
    cli_summary = gpufold("state", "--log", str(serve.log), "--json")["clusters"][0]
    assert cli_summary == summary
    assert client.get("/healthz").json() == {"ok": True, "problems": []}
