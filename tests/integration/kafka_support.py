"""Helpers for the tests against the real Kafka broker: unique topics, a command stream, reading back.

Every test makes its own topics (a unique prefix, few partitions, replication factor 1) so tests never
see each other's records, and checks what the processor committed against a local re-fold of the
same command frames with the same ``PartitionFolder``.
"""

from __future__ import annotations

import contextlib
import logging
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from kafka_settings.config import KafkaConfig, load
from kafka_settings.topics import create_topics, topic_specs, watermark_offsets
from logs.port import InputRecord, OutputRecord, Placement
from processor.core.fold import apply
from processor.core.snapshot import state_hash
from processor.core.state import PartitionState
from processor.runtime.loop import PartitionFolder
from producers.publisher import CommandPublisher
from schemas import DEAD_LETTER, EVENT, registry
from schemas.commands import AddNode, Command, Release, SetPolicy, SubmitPod
from schemas.events import Event
from schemas.topics import Topics, topics_for

REPO = Path(__file__).resolve().parents[2]
RDKAFKA_LOG = logging.getLogger("tests.rdkafka")
# The console script, not `python -m gpufold.cli`: run as __main__, cli.py would define a second CliError class.
GPUFOLD = [str(Path(sys.executable).with_name("gpufold"))]


def kafka_config(bootstrap: str) -> KafkaConfig:
    return load(bootstrap=bootstrap, environ={})


def new_topics(bootstrap: str, name: str, partitions: int = 3) -> Topics:
    """Create a fresh set of the four topics under a unique prefix."""
    prefix = f"t-{name}-{uuid.uuid4().hex[:8]}"
    topics = topics_for(prefix)
    create_topics(kafka_config(bootstrap).client(), topic_specs(topics, partitions, 1))
    return topics


def command_stream(count: int, clusters: int = 4, seed: int = 7, nodes: int = 12) -> list[Command]:
    """A deterministic stream: nodes first, then submissions and releases keeping clusters busy."""
    rng = random.Random(seed)
    names = [f"c{index}" for index in range(clusters)]
    commands: list[Command] = []
    for name in names:
        # The cheapest policy keeps the suite fast; these tests are about delivery, not placement.
        commands.append(Command(f"{name}-policy", name, len(commands), SetPolicy("first-fit"), "test"))
        for node in range(nodes):
            payload = AddNode(f"n{node}", 64_000, 512_000, "A100", 8)
            commands.append(Command(f"{name}-add-{node}", name, len(commands), payload, "test"))
    running: dict[str, list[str]] = {name: [] for name in names}
    serial = 0
    while len(commands) < count:
        name = rng.choice(names)
        pods = running[name]
        if pods and (len(pods) > 60 or rng.random() < 0.45):
            payload: SubmitPod | Release = Release(pods.pop(rng.randrange(len(pods))))
        else:
            serial += 1
            pod = f"p{serial}"
            pods.append(pod)
            share = rng.random() < 0.5
            payload = SubmitPod(
                pod, num_gpu=1 if share else rng.choice((1, 2, 4)), gpu_milli=rng.choice((250, 500)) if share else 1000,
                cpu_milli=rng.choice((1000, 4000)), memory_mib=rng.choice((4096, 16384)),
            )  # fmt: skip
        commands.append(Command(f"{name}-{len(commands)}", name, len(commands), payload, "test"))
    return commands[:count]


def publish(bootstrap: str, topics: Topics, commands: list[Command]) -> None:
    with CommandPublisher(kafka_config(bootstrap), topics.commands) as publisher:
        for command in commands:
            publisher.publish(command)


@dataclass
class Record:
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


def read_topic(bootstrap: str, topic: str, timeout: float = 60.0) -> dict[int, list[Record]]:
    """Every committed record of a topic (read_committed), by partition, in offset order."""
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "fetch.max.bytes": 128 << 20,
            "fetch.wait.max.ms": 10,  # the end of a partition shows at once, not after the default 500 ms wait
            "logger": RDKAFKA_LOG,
        }
    )
    try:
        partitions = sorted(consumer.list_topics(topic, timeout=10).topics[topic].partitions)
        out: dict[int, list[Record]] = {p: [] for p in partitions}
        pending = set()
        ends = {}
        assignment = []
        for partition in partitions:
            low, high = stable_end(bootstrap, consumer, TopicPartition(topic, partition), timeout)
            ends[partition] = high
            if high > low:
                pending.add(partition)
                assignment.append(TopicPartition(topic, partition, low))
        consumer.assign(assignment)
        deadline = time.monotonic() + timeout
        while pending:
            assert time.monotonic() < deadline, f"timed out reading {topic}; partitions left: {pending}"
            first = consumer.poll(0.5)  # returns with the first record; consume(n, t) would wait for n or t
            for message in [first, *consumer.consume(10_000, 0)] if first is not None else []:
                error = message.error()
                if error is not None:
                    assert error.code() == KafkaError._PARTITION_EOF, error
                    if message.offset() >= ends[message.partition()]:  # the stable end reached the high watermark
                        pending.discard(message.partition())
                    continue
                out[message.partition()].append(
                    Record(message.partition(), message.offset(), message.key(), message.value())
                )
        return out
    finally:
        consumer.close()


def stable_end(bootstrap: str, consumer: Consumer, tp: TopicPartition, timeout: float = 60.0) -> tuple[int, int]:
    """(low, end) of a partition once no transaction is open on it: its stable end reached the high watermark.

    A commit returns before the coordinator has written the transaction markers; until then the watermark
    query of a read_committed consumer answers the last stable offset (LSO), which stays at the transaction's
    first record, and reading "to the end" would miss committed records. The same holds, for up to the
    transaction timeout, behind the open transaction of a killed instance that nobody restarts (its partitions
    moved to a survivor, whose committed records come after it): the broker aborts it only when it times out.

    The high watermark must come from a ``read_uncommitted`` consumer: librdkafka's default isolation level is
    ``read_committed``, whose watermark query answers the LSO too, and the wait would end at once.
    """
    uncommitted = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"reader-{uuid.uuid4().hex}",
            "isolation.level": "read_uncommitted",
            "logger": RDKAFKA_LOG,
        }
    )
    try:
        deadline = time.monotonic() + timeout
        while True:
            low, stable = watermark_offsets(consumer, tp, 30)
            _, high = watermark_offsets(uncommitted, tp, 30)
            if stable >= high:
                return low, high
            assert time.monotonic() < deadline, f"{tp.topic}[{tp.partition}]: LSO {stable} < high watermark {high}"
            time.sleep(0.05)
    finally:
        uncommitted.close()


class CommittedWatcher:
    """Reads a group's committed offsets on the commands topic (without joining the group)."""

    def __init__(self, bootstrap: str, topics: Topics, group: str, partitions: int) -> None:
        self.topics = topics
        self.partitions = partitions
        self.consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})

    def total(self) -> int:
        """The sum of committed offsets (-1 if the coordinator did not answer in time)."""
        tps = [TopicPartition(self.topics.commands, p) for p in range(self.partitions)]
        try:
            return sum(max(tp.offset, 0) for tp in self.consumer.committed(tps, 5))
        except KafkaException:
            return -1

    def offsets(self) -> dict[int, int]:
        """The committed offset of each partition (0 if none)."""
        tps = [TopicPartition(self.topics.commands, p) for p in range(self.partitions)]
        while True:
            try:
                return {tp.partition: max(tp.offset, 0) for tp in self.consumer.committed(tps, 5)}
            except KafkaException:
                time.sleep(0.1)

    def wait_for(self, target: int, timeout: float, alive: Callable[[], bool] = lambda: True) -> int:
        deadline = time.monotonic() + timeout
        while True:
            total = self.total()
            if total >= target:
                return total
            assert alive(), f"the processor exited before {target} commands were committed (at {total})"
            assert time.monotonic() < deadline, f"only {total} of {target} commands committed in {timeout} s"
            time.sleep(0.05)

    def close(self) -> None:
        self.consumer.close()


@dataclass
class Refold:
    """What a local, uninterrupted fold of the commands topic derives."""

    events: dict[int, list[bytes]]
    dead_letters: dict[int, list[bytes]]
    hashes: dict[int, str]


def refold(commands: dict[int, list[Record]], topics: Topics, partitions: int | None = None) -> Refold:
    """Fold the command frames of every partition locally, exactly as the processor does (a fresh topic: every
    command checked for its partition and key, on ``partitions``, by default as many as ``commands`` has)."""
    events: dict[int, list[bytes]] = defaultdict(list)
    dead: dict[int, list[bytes]] = defaultdict(list)
    hashes: dict[int, str] = {}
    placement = Placement(partitions or len(commands))
    for partition, records in commands.items():
        folder = PartitionFolder(partition, topics, snapshot_every=0, placement=placement)
        out: list[OutputRecord] = []
        for record in records:
            folder.fold(InputRecord(partition, record.offset, record.key, record.value), out)
        for item in out:
            (events if item.topic == topics.events else dead)[partition].append(item.value)
        hashes[partition] = state_hash(folder.state)
    return Refold(dict(events), dict(dead), hashes)


def decode_events(values: list[bytes]) -> list[Event]:
    decode = registry().codec(EVENT).decode
    return [Event.from_avro(decode(value)) for value in values]


def check_exactly_once(bootstrap: str, topics: Topics) -> Refold:
    """Events on Kafka == the local re-fold, byte for byte; one outcome per command; gap-free sequences."""
    commands = read_topic(bootstrap, topics.commands)
    expected = refold(commands, topics)
    on_kafka = read_topic(bootstrap, topics.events)
    for partition, records in commands.items():
        values = [record.value for record in on_kafka.get(partition, [])]
        want = expected.events.get(partition, [])
        assert len(values) == len(want), f"partition {partition}: {len(values)} events on Kafka, {len(want)} expected"
        assert values == want, f"partition {partition}: events differ from the local re-fold"
        events = decode_events(values)  # type: ignore[arg-type]
        assert [event.sequence for event in events] == list(range(len(events))), "sequence gap or duplicate"
        dead = {dead_letter(value)["offset"] for value in expected.dead_letters.get(partition, [])}
        outcomes = {event.command_offset for event in events}
        assert outcomes == {record.offset for record in records} - dead, "a command without an outcome"
        # Each command's events are contiguous (one outcome group per command, never split or repeated).
        groups = [event.command_offset for event in events]
        runs = [offset for index, offset in enumerate(groups) if index == 0 or groups[index - 1] != offset]
        assert runs == sorted(set(runs)), "a command's events are split or repeated"
        state = PartitionState(partition=partition)
        for event in events:
            apply(state, event)
        assert state_hash(state) == expected.hashes[partition], f"partition {partition}: state hash differs"
    dead_on_kafka = read_topic(bootstrap, topics.dead_letters)
    for partition in commands:
        values = [record.value for record in dead_on_kafka.get(partition, [])]
        assert values == expected.dead_letters.get(partition, []), f"partition {partition}: dead letters differ"
    return expected


def dead_letter(value: bytes) -> dict:
    return registry().codec(DEAD_LETTER).decode(value)


def processor_command(bootstrap: str, topics: Topics, *extra: str) -> list[str]:
    prefix = topics.commands.rsplit(".", 1)[0]
    return [*GPUFOLD, "processor", "run", "--bootstrap", bootstrap, "--topic-prefix", prefix, *extra]


def start_processor(bootstrap: str, topics: Topics, *extra: str, log: Path | None = None) -> subprocess.Popen[bytes]:
    stderr = open(log, "ab") if log is not None else subprocess.DEVNULL  # noqa: SIM115
    return subprocess.Popen(processor_command(bootstrap, topics, *extra), cwd=REPO, stderr=stderr)


class BackgroundProcessor:
    """An in-process processor (``processor.runtime.kafka_runner.Runner``) running in a thread."""

    def __init__(self, bootstrap: str, topics: Topics, **settings: object) -> None:
        from processor.runtime.kafka_runner import Runner, RunnerSettings

        settings.setdefault("group_id", topics.commands + ".group")
        settings.setdefault("transaction_timeout_ms", 10_000)
        self.runner = Runner(kafka_config(bootstrap), topics, RunnerSettings(**settings))  # type: ignore[arg-type]
        self.status: int | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self.status = self.runner.run()

    def __enter__(self) -> BackgroundProcessor:
        self.thread.start()
        return self

    def wait(self, timeout: float = 120.0) -> int | None:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the processor did not stop"
        return self.status

    def __exit__(self, *exc: object) -> None:
        self.runner.stop()
        self.thread.join(60)


def fold_through_sigkills(
    bootstrap: str,
    topics: Topics,
    partitions: int,
    options: list[str],
    total: int,
    points: list[int],
    rng: random.Random,
    log: Path,
) -> None:
    """Run ``gpufold processor run`` and SIGKILL it a few ms after each of ``points`` commands are committed
    (anywhere in a later batch's fold/produce/commit), then let a last one fold all ``total`` and stop on
    SIGTERM. The group is the one in ``options`` (``--group``)."""
    group = options[options.index("--group") + 1]
    watcher = CommittedWatcher(bootstrap, topics, group, partitions)
    try:
        for point in points:
            process = start_processor(bootstrap, topics, *options, log=log)
            try:
                watcher.wait_for(point, 120, alive=lambda p=process: p.poll() is None)  # type: ignore[misc]
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(rng.uniform(0.0, 0.2))
                assert process.poll() is None, f"the processor exited with {process.returncode}; see {log}"
            finally:
                process.send_signal(signal.SIGKILL)
                process.wait()
        started = started_in(log)
        process = start_processor(bootstrap, topics, *options, log=log)
        try:
            assert watcher.wait_for(total, 180, alive=lambda: process.poll() is None) == total
        finally:
            status = stop_gracefully(process, log, started)
        assert status == 0, f"graceful stop exited with {status}; see {log}"
    finally:
        watcher.close()


def started_in(log: Path) -> int:
    """How many processors have logged their start in ``log`` (appended to by each)."""
    return log.read_text(errors="replace").count('"processor started"') if log.exists() else 0


def stop_gracefully(process: subprocess.Popen[bytes], log: Path, started_before: int) -> int:
    """SIGTERM ``process`` once it has started (``started_before`` starts were logged before it), and its status.

    The earlier processors may have committed everything already, so the caller's wait can end before this
    one has even imported Python's modules; a SIGTERM then meets the default handler (exit -15), which says
    nothing about a graceful stop.
    """
    deadline = time.monotonic() + 60
    while started_in(log) <= started_before and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGTERM)
    return process.wait(60)
