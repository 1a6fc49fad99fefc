"""faust-streaming vs the plain confluent-kafka consumer, projecting the same events topic into PostgreSQL.

Three steps (the faust one runs in a separate virtualenv: faust-streaming is not a project dependency):

    .venv/bin/python bench/projection_faust.py produce --bootstrap "$GPUFOLD_KAFKA_BOOTSTRAP" --topic T
    .venv/bin/python bench/projection_faust.py plain --bootstrap ... --topic T --database-url "$GPUFOLD_DATABASE_URL"
    PYTHONPATH=. /tmp/faust-venv/bin/python bench/projection_faust.py faust --bootstrap ... --topic T --database-url ...

Both consumers hand batches to the same ``projections.projector.Projector`` (one
transaction per batch, offsets in the database), each into its own fresh schema;
the figure is events per second from the first poll to the last commit.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine, text

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the repository root: tests.workload


def fresh_engine(url: str, schema: str) -> Any:
    from projections import models

    engine = create_engine(url)
    with engine.begin() as conn:
        conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE; CREATE SCHEMA "{schema}"'))
        models.Base.metadata.create_all(conn.execution_options(schema_translate_map={None: schema}))
    return engine


def produce(args: argparse.Namespace) -> None:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    from tests import workload

    admin = AdminClient({"bootstrap.servers": args.bootstrap})
    for future in admin.create_topics([NewTopic(args.topic, num_partitions=4, replication_factor=1)]).values():
        future.result(timeout=30)
    producer = Producer({"bootstrap.servers": args.bootstrap, "linger.ms": 20})
    total = 0
    for partition, cluster in enumerate(("c1", "c2", "c3", "c4")):
        cmds = workload.commands(args.commands, cluster=cluster, nodes=200, seed=partition, step_ms=2_000)
        events = workload.fold(cmds, partition=partition)
        for frame in workload.encode(events):
            producer.produce(args.topic, frame, key=cluster.encode(), partition=partition)
            producer.poll(0)
        total += len(events)
    producer.flush(60)
    print(f"produced {total} events to {args.topic}")


def plain(args: argparse.Namespace) -> None:
    from projections.projector import Projector
    from projections.runner import run
    from projections.sources import KafkaEventSource

    engine = fresh_engine(args.database_url, "bench_plain")
    source = KafkaEventSource(args.bootstrap, args.topic, group=f"bench-plain-{os.getpid()}")
    projector = Projector(engine, args.topic, schema="bench_plain")
    started = time.perf_counter()
    stats = run(projector, source, batch_size=args.batch_size, stop_when_idle=True)
    seconds = time.perf_counter() - started
    source.close()
    print(f"plain confluent-kafka: {stats.events} events in {seconds:.2f}s = {stats.events / seconds:,.0f} events/s "
          f"(includes group join)")  # fmt: skip


def faust_(args: argparse.Namespace) -> None:
    import faust

    from projections.projector import Projector
    from projections.sources import Decoder

    engine = fresh_engine(args.database_url, "bench_faust")
    projector = Projector(engine, args.topic, schema="bench_faust")
    decode = Decoder()
    app = faust.App(
        f"bench-faust-{os.getpid()}",
        broker=f"kafka://{args.bootstrap}",
        value_serializer="raw",
        consumer_auto_offset_reset="earliest",
        processing_guarantee="exactly_once",  # the consumer reads read_committed
        topic_disable_leader=True,
        web_enabled=False,
        datadir=f"/tmp/bench-faust-{os.getpid()}",
    )
    topic = app.topic(args.topic, value_type=bytes, value_serializer="raw", key_serializer="raw")
    expected = args.expect
    seen = {"events": 0, "first": 0.0, "batches": 0}

    @app.agent(topic)
    async def project(stream: Any) -> None:
        loop = asyncio.get_running_loop()
        async for events in stream.take_events(args.batch_size, within=0.5):
            if not seen["first"]:
                seen["first"] = time.perf_counter()
            batch = [decode(e.message.partition, e.message.offset, e.value) for e in events]
            result = await loop.run_in_executor(None, projector.project, batch)
            seen["events"] += result.applied
            seen["batches"] += 1
            if seen["events"] >= expected:
                seconds = time.perf_counter() - seen["first"]
                print(f"faust-streaming: {seen['events']} events in {seconds:.2f}s = "
                      f"{seen['events'] / seconds:,.0f} events/s (from the first batch; "
                      f"{seen['events'] / seen['batches']:.0f} events per batch)", flush=True)  # fmt: skip
                os._exit(0)

    sys.argv = [sys.argv[0], "worker", "-l", "warn"]
    app.main()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", choices=("produce", "plain", "faust"))
    parser.add_argument("--bootstrap", default=os.environ.get("GPUFOLD_KAFKA_BOOTSTRAP", ""))
    parser.add_argument("--topic", required=True)
    parser.add_argument("--database-url", default=os.environ.get("GPUFOLD_DATABASE_URL", ""))
    parser.add_argument("--commands", type=int, default=10_000)
    parser.add_argument("--batch-size", type=int, default=5_000)
    parser.add_argument("--expect", type=int, default=0, help="faust: stop after this many events")
    args = parser.parse_args()
    {"produce": produce, "plain": plain, "faust": faust_}[args.mode](args)


if __name__ == "__main__":
    main()
