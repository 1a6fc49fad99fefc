"""GET /v1/pods latency with 100k running pods in the live replica (p50/p99 over real HTTP).

    .venv/bin/python bench/pods_listing.py [--pods 100000] [--runs 1000]

An embedded log is filled with an openb-like cluster (``--pods`` / 8 nodes of 8 GPUs, two GPU
models, four zones) and ``--pods`` SubmitPods that all fit (whole GPUs and shares, 37 tenants).
``gpufold serve --read-only --no-processor`` is started on it in a separate process (so the client
does not share its interpreter), the replica folds the log, and then each listing is requested
``--runs`` times, one after another, on one keep-alive connection; then ``POST /v1/what-if``
with one SubmitPod ``--what-if-runs`` times.
"""

from __future__ import annotations

import argparse
import os
import platform
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from logs.embedded import EmbeddedLog
from schemas import COMMAND, registry
from schemas.commands import AddNode, Command, SubmitPod

T0 = 1_767_225_600_000


def fill(path: Path, pods: int) -> int:
    encode = registry().codec(COMMAND).encode
    nodes = pods // 8 + 1
    commands = [
        Command(f"add-{i}", "prod", T0 + i, AddNode(f"node-{i:06d}", 256_000, 2_097_152, ("A100", "H100")[i % 2], 8,
                                                    {"topology.kubernetes.io/zone": f"z{i % 4}"}))
        for i in range(nodes)
    ]  # fmt: skip
    for i in range(pods):
        share = i % 3 == 0
        payload = SubmitPod(f"pod-{i:07d}", f"tenant-{i % 37}", 0, 1, 500 if share else 1000, 1_000, 1_024)
        commands.append(Command(f"sub-{i}", "prod", T0 + nodes + i, payload))
    with EmbeddedLog(path) as log:
        for start in range(0, len(commands), 20_000):
            chunk = commands[start : start + 20_000]
            log.append_commands((c.cluster.encode(), encode(c.to_avro())) for c in chunk)
    return nodes


def timed(client: httpx.Client, path: str, runs: int) -> tuple[float, float, float, int]:
    for _ in range(50):
        client.get(path).raise_for_status()
    samples = []
    size = 0
    for _ in range(runs):
        started = time.perf_counter()
        response = client.get(path)
        response.raise_for_status()
        samples.append((time.perf_counter() - started) * 1000)
        size = len(response.content)
    samples.sort()
    return statistics.median(samples), samples[int(0.99 * (len(samples) - 1))], samples[-1], size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=1_000)
    parser.add_argument("--what-if-runs", type=int, default=50)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="gpufold-bench-pods-"))
    log_path = work / "log.sqlite"
    started = time.perf_counter()
    nodes = fill(log_path, args.pods)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")
    print(f"log: {nodes} nodes, {args.pods} pods appended in {time.perf_counter() - started:.1f}s")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    gpufold = str(Path(sys.executable).with_name("gpufold"))
    server = subprocess.Popen(
        [gpufold, "serve", "--log", str(log_path), "--read-only", "--no-processor", "--port", str(port)],
        stderr=subprocess.DEVNULL,
    )
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
            started = time.perf_counter()
            while True:
                try:
                    position = client.get("/v1/replica").json()
                    if position["ready"] and position["lag"] == 0:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.2)
            running = client.get("/v1/pods", params={"state": "running", "limit": 1}).json()["total"]
            print(f"replica at the head with {running} running pods after {time.perf_counter() - started:.1f}s")
            cases = {
                "running, first page (100)": "/v1/pods?state=running&limit=100",
                "running, cluster + tenant": "/v1/pods?state=running&cluster=prod&tenant=tenant-7&limit=100",
                "running, one node": "/v1/pods?state=running&cluster=prod&node=node-004242",
                "running, page at offset 50000": "/v1/pods?state=running&offset=50000&limit=100",
                "running, largest page (1000)": "/v1/pods?state=running&limit=1000",
                "any state, tenant": "/v1/pods?tenant=tenant-3&limit=100",
            }
            for name, path in cases.items():
                p50, p99, worst, size = timed(client, path, args.runs)
                print(f"{name:32s} p50 {p50:6.2f} ms   p99 {p99:6.2f} ms   max {worst:6.2f} ms   "
                      f"({args.runs} runs, {size / 1024:.0f} KiB)")  # fmt: skip
            # What-if on the same state: fork the cluster, fold one SubmitPod, answer (nothing published).
            asked = {"cluster": "prod", "payload": {"SubmitPod": {"pod_id": "what-if", "num_gpu": 1, "gpu_milli": 500}}}
            samples = []
            for _ in range(args.what_if_runs):
                started = time.perf_counter()
                client.post("/v1/what-if", json=asked).raise_for_status()
                samples.append((time.perf_counter() - started) * 1000)
            samples.sort()
            print(f"{'POST /v1/what-if (1 SubmitPod)':32s} p50 {statistics.median(samples):6.2f} ms   "
                  f"p99 {samples[int(0.99 * (len(samples) - 1))]:6.2f} ms   max {samples[-1]:6.2f} ms   "
                  f"({args.what_if_runs} runs)")  # fmt: skip
    finally:
        server.terminate()
        server.wait(30)
        for file in work.iterdir():
            file.unlink()
        work.rmdir()


if __name__ == "__main__":
    main()
