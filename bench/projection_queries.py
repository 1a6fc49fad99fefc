"""Query latency with 100k pods in the tables: utilization now and the pending queue (p50/p99).

    .venv/bin/python bench/projection_queries.py --database-url "$GPUFOLD_DATABASE_URL" [--pods 100000]

The tables of a fresh schema ``bench_queries`` are filled directly (bulk COPY)
with an openb-sized cluster (1,213 GPU nodes, the trace's models) and ``--pods``
pods: 20% pending (with reasons), 40% running (with allocations), 40% released,
plus one audit event per pod. Then each query runs ``--runs`` times on one
connection, as the API does per request, and again over HTTP (the FastAPI app
under uvicorn on a loopback port, one keep-alive client). The schema is dropped afterwards.
"""

from __future__ import annotations

import argparse
import os
import platform
import random
import socket
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

from sqlalchemy import create_engine, text

from projections import models, queries
from projections.dialect import bulk_insert
from projections.secrets import safe_url

MODELS = (("G2", 4, 606), ("T4", 2, 180), ("G3", 8, 173), ("V100M32", 8, 118), ("P100", 2, 60), ("G1", 8, 48),
          ("A10", 1, 28))  # fmt: skip
T0 = 1_767_225_600_000


def fill(conn: Any, pods: int, seed: int = 1) -> None:
    rng = random.Random(seed)
    nodes = []
    for model, gpus, count in MODELS:
        for _ in range(count):
            nodes.append(
                {"cluster": "openb", "node_id": f"node-{len(nodes):05d}", "gpu_model": model, "gpu_count": gpus,
                 "cpu_milli": 96_000, "memory_mib": 393_216, "labels": {}, "taints": [], "cordoned": False,
                 "failed": False, "gpu_free": [1000] * gpus, "gpu_milli_allocated": 0, "cpu_allocated": 0,
                 "memory_allocated": 0, "pods_running": 0, "added_at": T0, "updated_sequence": len(nodes)}
            )  # fmt: skip
    pod_rows, allocation_rows, audit_rows = [], [], []
    for i in range(pods):
        roll = i % 5
        status = "pending" if roll == 0 else "running" if roll in (1, 2) else "released"
        num_gpu, milli = rng.choice(((1, 1000), (1, 500), (1, 250), (2, 1000), (0, 0)))
        pod = {"cluster": "openb", "pod_id": f"pod-{i:07d}", "tenant": f"tenant-{i % 37}",
               "priority": rng.choice((0, 0, 10)), "num_gpu": num_gpu, "gpu_milli": milli, "cpu_milli": 4_000,
               "memory_mib": 8_192, "gpu_models": [], "arrival": i, "status": status, "node_id": None, "gpus": [],
               "reasons": [], "submitted_at": T0 + i, "queued_at": None, "scheduled_at": None, "ended_at": None,
               "end_reason": None, "updated_sequence": i}  # fmt: skip
        if status == "pending":
            pod["reasons"] = [{"code": "INSUFFICIENT_GPU", "nodes": 1213, "message": ""}]
            pod["queued_at"] = T0 + i
        elif status == "running":
            node = nodes[rng.randrange(len(nodes))]
            free = node["gpu_free"]
            shares = [[g, milli] for g in range(len(free)) if free[g] >= milli][:num_gpu]
            if num_gpu and len(shares) < num_gpu:
                status = pod["status"] = "released"
            else:
                for g, m in shares:
                    free[g] -= m
                    allocation_rows.append({"cluster": "openb", "pod_id": pod["pod_id"], "gpu_index": g,
                                            "node_id": node["node_id"], "milli": m})  # fmt: skip
                node["gpu_milli_allocated"] += num_gpu * milli
                node["pods_running"] += 1
                pod.update(node_id=node["node_id"], gpus=shares, scheduled_at=T0 + i)
        pod_rows.append(pod)
        audit_rows.append({"partition": 0, "sequence": i, "cluster": "openb", "command_id": f"cmd-{i}",
                           "command_offset": i, "occurred_at": T0 + i, "type": "PodQueued", "pod_id": pod["pod_id"],
                           "node_id": None, "frame": b"\xc3\x01" + bytes(8)})  # fmt: skip
    totals: dict[str, dict[str, Any]] = {}
    for node in nodes:
        total = totals.setdefault(
            node["gpu_model"],
            {
                "cluster": "openb",
                "gpu_model": node["gpu_model"],
                "nodes": 0,
                "capacity_milli": 0,
                "allocated_milli": 0,
                "pods_running": 0,
            },
        )
        total["nodes"] += 1
        total["capacity_milli"] += node["gpu_count"] * 1000
        total["allocated_milli"] += node["gpu_milli_allocated"]
        total["pods_running"] += node["pods_running"]
    stats = {
        "cluster": "openb",
        "pending": sum(p["status"] == "pending" for p in pod_rows),
        "running": sum(p["status"] == "running" for p in pod_rows),
    }
    conn.execute(models.gpu_totals.insert(), list(totals.values()))
    conn.execute(models.cluster_stats.insert(), [stats])
    for table, rows in ((models.nodes, nodes), (models.pods, pod_rows), (models.allocations, allocation_rows),
                        (models.audit_events, audit_rows)):  # fmt: skip
        for start in range(0, len(rows), 20_000):
            bulk_insert(conn, table, rows[start : start + 20_000])


def timed(call: Callable[[], Any], runs: int) -> tuple[float, float, float]:
    for _ in range(min(20, runs)):  # warm the caches and the prepared statements
        call()
    samples = []
    for _ in range(runs):
        started = time.perf_counter()
        call()
        samples.append((time.perf_counter() - started) * 1000)
    samples.sort()
    return statistics.median(samples), samples[int(0.99 * (len(samples) - 1))], samples[-1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("GPUFOLD_DATABASE_URL", ""))
    parser.add_argument("--pods", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=500)
    args = parser.parse_args()
    schema = "bench_queries"
    engine = create_engine(args.database_url)
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE; CREATE SCHEMA "{schema}"'))
        translate = {"schema_translate_map": {None: schema}}
    else:
        translate = {}
    engine = engine.execution_options(**translate)
    models.Base.metadata.create_all(engine)
    started = time.perf_counter()
    with engine.begin() as conn:
        fill(conn, args.pods)
    with engine.begin() as conn:
        if engine.dialect.name == "postgresql":
            for table in models.TABLES:
                conn.execute(text(f'ANALYZE "{schema}"."{table.name}"'))
        counts = {t: conn.execute(text(f"SELECT count(*) FROM {t}" if not translate else
                                       f'SELECT count(*) FROM "{schema}".{t}')).scalar()
                  for t in ("pods", "nodes", "allocations")}  # fmt: skip
    print(f"database: {safe_url(args.database_url)}; machine: {platform.machine()}, {os.cpu_count()} cores, "
          f"load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(f"filled {counts} in {time.perf_counter() - started:.1f}s")
    with engine.connect() as conn:
        cases = {
            "utilization by cluster": lambda: queries.utilization_now(conn, by="cluster"),
            "utilization by model": lambda: queries.utilization_now(conn, by="model", cluster="openb"),
            "pending, first 100": lambda: queries.pending(conn, cluster="openb", limit=100),
            "pending, 100 at offset 10000": lambda: queries.pending(conn, cluster="openb", limit=100, offset=10_000),
        }
        for name, call in cases.items():
            p50, p99, worst = timed(call, args.runs)
            print(f"{name:32s} p50 {p50:6.2f} ms   p99 {p99:6.2f} ms   max {worst:6.2f} ms   ({args.runs} runs)")
    # Over real HTTP: uvicorn on a free loopback port, one keep-alive client.
    import httpx
    import uvicorn

    from projections.api import create_app

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(engine), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    with httpx.Client(base_url=f"http://127.0.0.1:{port}") as client:
        for name, path in (("HTTP /v1/utilization?by=model", "/v1/utilization?by=model"),
                           ("HTTP /v1/pending?cluster=openb", "/v1/pending?cluster=openb")):  # fmt: skip
            p50, p99, worst = timed(lambda path=path: client.get(path).raise_for_status(), args.runs)
            print(f"{name:32s} p50 {p50:6.2f} ms   p99 {p99:6.2f} ms   max {worst:6.2f} ms   ({args.runs} runs)")
    server.should_exit = True
    thread.join(10)
    if engine.dialect.name == "postgresql":
        with engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    engine.dispose()


if __name__ == "__main__":
    main()
