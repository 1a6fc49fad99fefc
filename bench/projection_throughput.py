"""Projection throughput: events/s from encoded event frames into PostgreSQL (or SQLite), decode included.

    .venv/bin/python bench/projection_throughput.py --database-url "$GPUFOLD_DATABASE_URL" [--commands 60000]
        [--projectors 2] [--no-pipeline] [--frames-cache /tmp/frames.pickle]

The events come from the synthetic workload (``tests/workload.py``: real folds
of a mixed command stream), encoded as the processor publishes them. The timed
part is what the projector does per batch: decode the frames, apply them, write
the rows and offsets in one transaction. Kafka consumption is not included (see
the processor's benchmark for broker throughput). The tables are created in a
fresh PostgreSQL schema ``bench_projection`` (dropped afterwards).

With ``--projectors K`` the partitions are split between K projector processes
(partition p goes to projector p mod K), as K members of one consumer group
would share them, all writing the same tables; the rate is all events over the
wall time from their common start to the last one's end. ``--no-pipeline``
projects each batch in turn (apply, write, commit) instead of applying a batch
while the one before it commits.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import pickle
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: tests.workload

from projections import models
from projections.envelope import Envelope
from projections.projector import Projector
from projections.runner import run
from projections.secrets import safe_url
from projections.sources import Decoder
from tests import workload


class FrameSource:
    """Encoded event frames in memory, decoded on poll (in the runner's reader thread) like a Kafka consumer does."""

    name = "bench.events"

    def __init__(self, frames: list[tuple[int, bytes]]) -> None:
        self._frames = frames
        self._next = 0
        self._offsets: dict[int, int] = {}
        self._decode = Decoder()

    def start(self, positions: Callable[[], dict[int, int]]) -> None:
        positions()

    def poll(self, max_records: int, timeout: float) -> list[Envelope]:
        chunk = self._frames[self._next : self._next + max_records]
        self._next += len(chunk)
        out = []
        for partition, frame in chunk:
            offset = self._offsets.get(partition, 0)
            self._offsets[partition] = offset + 1
            out.append(self._decode(partition, offset, frame))
        return out

    def caught_up(self) -> bool:
        return self._next >= len(self._frames)

    def lag(self) -> int | None:
        return len(self._frames) - self._next

    def close(self) -> None:
        pass


def server_cpu(engine: Any) -> float:
    """CPU seconds used so far by this benchmark's PostgreSQL backends (same machine only; 0 if unknown)."""
    if engine.dialect.name != "postgresql":
        return 0.0
    with engine.connect() as conn:
        pids = conn.execute(text("SELECT pid FROM pg_stat_activity WHERE application_name = 'gpufold-bench'")).scalars()
        total = 0.0
        for pid in pids:
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                return 0.0
            total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        return total


def workload_frames(commands: int, cache: str | None) -> list[tuple[int, bytes]]:
    """(partition, frame) of 4 clusters' events, interleaved in chunks as a consumer's fetches would be."""
    if cache and Path(cache).exists():
        cached: list[tuple[int, bytes]] = pickle.loads(Path(cache).read_bytes())
        return cached
    per_partition: list[list[tuple[int, bytes]]] = []
    for partition, cluster in enumerate(("c1", "c2", "c3", "c4")):
        cmds = workload.commands(commands, cluster=cluster, nodes=200, seed=partition, step_ms=2_000)
        events = workload.fold(cmds, partition=partition)
        per_partition.append([(partition, frame) for frame in workload.encode(events)])
    frames: list[tuple[int, bytes]] = []
    longest = max(len(part) for part in per_partition)
    for start in range(0, longest, 1_000):
        for part in per_partition:
            frames.extend(part[start : start + 1_000])
    if cache:
        Path(cache).write_bytes(pickle.dumps(frames))
    return frames


def project_share(
    url: str, schema: str | None, frames: list[tuple[int, bytes]], batch_size: int, pipeline: bool,
    go: Any, done: Any, release: Any,
) -> None:  # fmt: skip
    """One projector process: its own engine, its partitions' frames; waits for ``go``, reports (events, CPU s),
    and keeps its connections until ``release`` (so that their server CPU can be read)."""
    connect_args = {"application_name": "gpufold-bench"} if url.startswith("postgresql") else {}
    engine = create_engine(url, connect_args=connect_args)
    projector = Projector(engine, "bench.events", schema=schema)
    go.wait()
    cpu = time.process_time()
    stats = run(projector, FrameSource(frames), batch_size=batch_size, poll_timeout=0.0, stop_when_idle=True,
                pipeline=pipeline)  # fmt: skip
    done.put((stats.events, time.process_time() - cpu))
    release.wait()
    engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--database-url", default=os.environ.get("GPUFOLD_DATABASE_URL", "sqlite://"))
    parser.add_argument("--commands", type=int, default=25_000, help="commands per cluster (4 clusters)")
    parser.add_argument("--batch-size", type=int, default=5_000)
    parser.add_argument("--projectors", type=int, default=1, help="projector processes sharing the partitions")
    parser.add_argument("--no-pipeline", action="store_true", help="apply, write and commit each batch in turn")
    parser.add_argument("--frames-cache", help="keep the encoded workload in this file (pickle) between runs")
    args = parser.parse_args()

    t = time.perf_counter()
    frames = workload_frames(args.commands, args.frames_cache)
    print(f"workload: {len(frames)} events from 4 clusters in {time.perf_counter() - t:.1f}s")

    connect_args = {"application_name": "gpufold-bench"} if args.database_url.startswith("postgresql") else {}
    engine = create_engine(args.database_url, connect_args=connect_args)
    schema = None
    if engine.dialect.name == "postgresql":
        schema = "bench_projection"
        with engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE; CREATE SCHEMA "{schema}"'))
            models.Base.metadata.create_all(conn.execution_options(schema_translate_map={None: schema}))
    else:
        if args.projectors > 1:
            parser.error("--projectors > 1 needs PostgreSQL")
        models.Base.metadata.create_all(engine)
    pipeline = not args.no_pipeline and engine.dialect.name == "postgresql"
    if args.projectors > 1:
        context = multiprocessing.get_context("fork")
        go, done, release = context.Event(), context.Queue(), context.Event()
        shares = [[f for f in frames if f[0] % args.projectors == i] for i in range(args.projectors)]
        workers = [
            context.Process(target=project_share,
                            args=(args.database_url, schema, share, args.batch_size, pipeline, go, done, release))
            for share in shares
        ]  # fmt: skip
        for worker in workers:
            worker.start()
        time.sleep(1.0)  # engines created, waiting
        server_before = server_cpu(engine)
        start_wall = time.perf_counter()
        go.set()
        reports = [done.get() for _ in workers]
        wall = time.perf_counter() - start_wall
        server = server_cpu(engine) - server_before
        release.set()
        for worker in workers:
            worker.join()
        events, cpu = sum(r[0] for r in reports), sum(r[1] for r in reports)
    else:
        projector = Projector(engine, "bench.events", schema=schema)
        source = FrameSource(frames)
        start_wall, start_cpu = time.perf_counter(), time.process_time()
        server_before = server_cpu(engine)
        stats = run(projector, source, batch_size=args.batch_size, poll_timeout=0.0, stop_when_idle=True,
                    pipeline=pipeline)  # fmt: skip
        wall, cpu = time.perf_counter() - start_wall, time.process_time() - start_cpu
        events = stats.events
        server = server_cpu(engine) - server_before
    assert events == len(frames), (events, len(frames))
    with engine.connect() as conn:
        if schema:
            conn = conn.execution_options(schema_translate_map={None: schema})
        pods = conn.execute(text(f"SELECT count(*) FROM {schema + '.' if schema else ''}pods")).scalar()
    print(f"database: {safe_url(args.database_url)} ({engine.dialect.name}); machine: {platform.machine()}, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}")  # fmt: skip
    how = f"{args.projectors} projector(s), {'pipelined' if pipeline else 'not pipelined'}, batch {args.batch_size}"
    print(f"projected {len(frames)} events ({pods} pods) in {wall:.2f}s wall ({how}): {len(frames) / wall:,.0f} "
          f"events/s; projector process CPU {cpu:.2f}s ({len(frames) / cpu:,.0f} events per CPU-second)")  # fmt: skip
    n = len(frames)
    if server:
        cores = os.cpu_count() or 1
        print(f"PostgreSQL backend CPU {server:.2f}s ({server / n * 1e6:.1f} us/event); projector "
              f"{cpu / n * 1e6:.1f} us/event; together {(cpu + server) / n * 1e6:.1f} us/event, so on "
              f"{cores} otherwise idle cores the bound is ~{n * cores / (cpu + server):,.0f} events/s")  # fmt: skip
    if schema:
        with engine.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    engine.dispose()


if __name__ == "__main__":
    main()
