"""Issue 12 on the real broker and database: oversized and far-future commands stall nothing.

A 700 KB command id used to make a ~2 MB rejection event: past the events topic's 1 MiB
record limit, the processor's transaction failed on it again and again (a wedged
partition). A command issued in microseconds (year ~58,000) was accepted and made the
projector seal one usage row per hour up to it. Now both are small rejections, the
commands after them are folded, the events equal a local re-fold byte for byte, and
the projector into PostgreSQL keeps its event-time clock where the valid commands left it.
"""

from __future__ import annotations

import random
import threading
import time
import uuid
from urllib.parse import quote

import pytest
from kafka_support import BackgroundProcessor, check_exactly_once, kafka_config, new_topics
from sqlalchemy import create_engine, select, text

from producers.outcomes import OutcomeWaiter
from producers.publisher import CommandPublisher
from projections import models
from projections.projector import Projector
from projections.runner import run
from projections.schema import ensure_schema
from projections.sources import KafkaEventSource
from schemas.commands import AddNode, Command, Release, SubmitPod
from schemas.fastcodec import encode_command
from schemas.limits import MAX_ISSUED_AT, stand_in

pytestmark = pytest.mark.integration

T0 = 1_767_225_600_000  # 2026-01-01


def _incompressible(size: int, seed: int) -> str:
    """Random letters and digits: lz4 on the producer cannot shrink them below the broker's limit."""
    rng = random.Random(seed)
    return "".join(rng.choices("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", k=size))


def test_oversized_and_far_future_commands_do_not_stall_the_processor_or_the_projector(
    kafka_bootstrap: str, database_url: str
) -> None:
    """Each bad command gets a small rejection, the good ones around them are folded, the read side keeps time."""
    topics = new_topics(kafka_bootstrap, "hostile", 1)
    config = kafka_config(kafka_bootstrap)
    big_id = _incompressible(700_000, 1)
    big_cluster = _incompressible(400_000, 2)
    commands = [
        Command("c-node", "lab", T0, AddNode("n1", 64_000, 65_536, "A100", 8), "test"),
        Command("c-pod", "lab", T0 + 1_000, SubmitPod("p1", "acme", num_gpu=1, gpu_milli=1000, cpu_milli=1), "test"),
        Command(big_id, "lab", T0 + 2_000, Release("p1"), "test"),  # 700 KB id
        Command("c-big-cluster", big_cluster, T0 + 3_000, Release("p1"), "test"),  # 400 KB key and cluster
        Command("c-far", "lab", 1_767_225_604_000_000, Release("p1"), "test"),  # microseconds by mistake
        Command("c-after", "lab", T0 + 5_000, Release("p1"), "test"),
    ]
    with OutcomeWaiter(config, topics.events) as waiter:
        with CommandPublisher(config, topics.commands) as publisher:
            for command in commands:  # send() skips the client-side checks on purpose: this is hostile input
                publisher.send(command.cluster.encode()[:1_000_000], encode_command(command))
        started = time.monotonic()
        with BackgroundProcessor(kafka_bootstrap, topics, instance_id="hostile", stop_when_idle=0):
            assert waiter.wait("c-after", 60).kind == "PodReleased"  # folded after the bad ones: no stall
            assert waiter.wait(stand_in(big_id), 10).events[0].payload.code == "INVALID_COMMAND"  # type: ignore[union-attr]
            assert waiter.wait("c-big-cluster", 10).events[0].payload.code == "INVALID_COMMAND"  # type: ignore[union-attr]
            assert waiter.wait("c-far", 10).events[0].payload.code == "TIME_OUT_OF_RANGE"  # type: ignore[union-attr]
        assert time.monotonic() - started < 60
    check_exactly_once(kafka_bootstrap, topics)

    # The read side: project the events into PostgreSQL; the µs command must not move the clock to 2099.
    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(database_url)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    separator = "&" if "?" in database_url else "?"
    engine = create_engine(f"{database_url}{separator}options={quote(f'-csearch_path={schema}')}")
    try:
        ensure_schema(engine)
        source = KafkaEventSource(kafka_bootstrap, topics.events, group=f"{schema}-projector")
        stop, timed_out = threading.Event(), threading.Event()

        def give_up() -> None:  # a stalled projector fails the test instead of hanging it
            timed_out.set()
            stop.set()

        timer = threading.Timer(90, give_up)
        timer.start()
        try:
            stats = run(Projector(engine, source.name), source, stop_when_idle=True, stop=stop)
        finally:
            timer.cancel()
            source.close()
        assert not timed_out.is_set() and stats.events == 6
        with engine.connect() as conn:
            clocks = {row.cluster: row for row in conn.execute(select(models.usage_clocks))}
            usage = conn.execute(select(models.tenant_usage)).all()
        assert clocks["lab"].watermark == T0 + 5_000 < MAX_ISSUED_AT
        assert len(usage) <= 2 and all(len(cluster) <= 253 for cluster in clocks)
    finally:
        engine.dispose()
        with admin.begin() as conn:
            conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        admin.dispose()
