"""End-to-end figures on a real Kafka broker, with exactly-once on (not a test: a measurement).

Three measurements, each on fresh topics:

1. ``throughput``: pre-publish N commands (publish rate reported), then start ``--instances`` processor
   processes (``gpufold processor run``, one consumer group) and time how fast the group's committed
   offsets advance from the first commit to N: commands folded, produced and committed per second.
2. ``latency``: a processor runs; a paced publisher offers ``--rate`` commands/s for ``--seconds``; a
   read_committed consumer of the events topic stamps the arrival of each command's first event.
   Latency = arrival - the moment ``produce()`` was called. p50/p99/p99.9/max reported.
3. ``replay``: read the whole commands topic back and fold it locally (no output): replay commands/s.
4. ``restore`` (only with ``--only restore``): one partition restored from its snapshot and a 300-command tail,
   three times: seconds reading the snapshot, reading the tail, and the whole ``restore_state``.

Usage (a broker from ``bash scripts/kafka.sh start; source .services/kafka.env``)::

    python bench/kafka_end_to_end.py --commands 100000 --instances 2 --rate 200 --rate 1000 --rate 5000 \
        --seconds 20 [--json]

Each row also gives the processors' CPU per command (from their "processor stopped" log line): the whole process
(librdkafka's threads included), the fold's share, and the rest, which is what the runtime costs per command.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, TopicPartition

from kafka_settings.config import KafkaConfig, load
from kafka_settings.topics import create_topics, topic_specs, watermark_offsets
from processor.runtime.kafka_log import KafkaCommandLog
from processor.runtime.loop import InputRecord, OutputRecord, PartitionFolder, Processor, restore_state
from producers.publisher import CommandPublisher
from schemas import COMMAND, EVENT, registry
from schemas.commands import AddNode, Command, Release, SetPolicy, SubmitPod
from schemas.topics import Topics, topics_for

REPO = Path(__file__).resolve().parents[1]


def stream(count: int, clusters: int, policy: str, seed: int = 1) -> list[Command]:
    """Nodes, then a steady mix of submissions and releases (~half the clusters' GPUs busy)."""
    rng = random.Random(seed)
    names = [f"bench-{index}" for index in range(clusters)]
    commands: list[Command] = []
    for name in names:
        commands.append(Command(f"{name}-policy-{uuid.uuid4().hex[:6]}", name, 0, SetPolicy(policy), "b"))
        for node in range(40):
            commands.append(Command(f"{name}-n{node}", name, 0, AddNode(f"n{node}", 64_000, 512_000, "A100", 8), "b"))
    running: dict[str, list[str]] = {name: [] for name in names}
    serial = 0
    while len(commands) < count:
        name = rng.choice(names)
        pods = running[name]
        if len(pods) > 120 or (pods and rng.random() < 0.5):
            payload: SubmitPod | Release = Release(pods.pop(rng.randrange(len(pods))))
        else:
            serial += 1
            pods.append(f"p{serial}")
            payload = SubmitPod(f"p{serial}", num_gpu=1, gpu_milli=rng.choice((250, 500, 1000)), cpu_milli=2_000)
        commands.append(Command(f"{name}-{len(commands)}-{uuid.uuid4().hex[:6]}", name, len(commands), payload, "b"))
    return commands[:count]


def fresh_topics(config: KafkaConfig, partitions: int, name: str) -> Topics:
    topics = topics_for(f"bench-{name}-{uuid.uuid4().hex[:8]}")
    create_topics(config.client(), topic_specs(topics, partitions, 1))
    return topics


def start_processors(config: KafkaConfig, topics: Topics, group: str, instances: int, *extra: str) -> list:
    """``gpufold processor run`` processes; each one's stderr (JSON log lines) goes to a temporary file."""
    command = [str(Path(sys.executable).with_name("gpufold")), "processor", "run", "--bootstrap", config.bootstrap]
    command += ["--topic-prefix", topics.commands.rsplit(".", 1)[0], "--group", group, *extra]
    processes = []
    for index in range(instances):
        log = tempfile.TemporaryFile()  # noqa: SIM115 - closed in stop()
        process = subprocess.Popen([*command, "--instance-id", f"bench-{index}"], cwd=REPO, stderr=log)
        process.log = log  # type: ignore[attr-defined]
        processes.append(process)
    return processes


def stop(processes: list) -> list[dict]:
    """SIGTERM every processor; returns the fields of each one's "processor stopped" log line (its costs)."""
    for process in processes:
        process.send_signal(signal.SIGTERM)
    stopped = []
    for process in processes:
        process.wait(60)
        process.log.seek(0)
        for line in process.log:
            with contextlib.suppress(ValueError):
                entry = json.loads(line)
                if entry.get("msg") == "processor stopped":
                    stopped.append(entry)
        process.log.close()
    return stopped


def costs(stopped: list[dict]) -> dict:
    """CPU per command of the processors (mean over instances, weighted by commands), split by stage.

    ``process_cpu_us``: the whole process, librdkafka's threads included; ``fold_cpu_us``: the main thread in
    the fold (decode, decide, encode, restores); ``runtime_cpu_us``: everything else, the runtime's own cost.
    """
    records = sum(entry.get("processed", 0) for entry in stopped) or 1

    def mean(get: Callable[[dict], float]) -> float:
        return round(sum(get(entry) * entry.get("processed", 0) for entry in stopped) / records, 1)

    process = mean(lambda entry: entry.get("process_cpu_us", 0.0))
    fold = mean(lambda entry: entry.get("per_command_us", {}).get("fold_cpu", 0.0))
    return {
        "process_cpu_us": process,
        "fold_cpu_us": fold,
        "runtime_cpu_us": round(process - fold, 1),
        "poll_cpu_us": mean(lambda entry: entry.get("per_command_us", {}).get("poll_cpu", 0.0)),
        "commit_cpu_us": mean(lambda entry: entry.get("per_command_us", {}).get("commit_cpu", 0.0)),
        "commit_wall_us": mean(lambda entry: entry.get("per_command_us", {}).get("commit_wall", 0.0)),
        "batches": sum(entry.get("batches", 0) for entry in stopped),
    }


def committed(consumer: Consumer, topics: Topics, partitions: int) -> int:
    tps = [TopicPartition(topics.commands, p) for p in range(partitions)]
    try:
        return sum(max(tp.offset, 0) for tp in consumer.committed(tps, 10))
    except Exception:
        return -1


def bench_throughput(config: KafkaConfig, args: argparse.Namespace) -> dict:
    topics = fresh_topics(config, args.partitions, "tput")
    commands = stream(args.commands, args.clusters, args.policy)
    frames = [(c.cluster.encode(), registry().codec(COMMAND).encode(c.to_avro())) for c in commands]
    started = time.perf_counter()
    with CommandPublisher(config, topics.commands) as publisher:
        for key, value in frames:
            publisher.send(key, value)
    publish_seconds = time.perf_counter() - started
    group = topics.commands + ".group"
    watcher = Consumer(config.client(overrides={"group.id": group, "enable.auto.commit": False}))
    processes = start_processors(config, topics, group, args.instances, "--batch-size", str(args.batch_size))
    try:
        first_at = None
        first_count = 0
        while True:
            done = committed(watcher, topics, args.partitions)
            now = time.perf_counter()
            if done > 0 and first_at is None:
                first_at, first_count = now, done
            if done >= args.commands:
                break
            if now - started > 900:
                raise SystemExit(f"timed out at {done} committed")
            time.sleep(0.05)
    finally:
        stopped = stop(processes)
        watcher.close()
    seconds = now - first_at  # type: ignore[operator]
    return {
        "bench": "throughput",
        "commands": args.commands,
        "partitions": args.partitions,
        "policy": args.policy,
        "instances": args.instances,
        "batch_size": args.batch_size,
        "publish_per_s": round(args.commands / publish_seconds),
        "processed_per_s": round((args.commands - first_count) / seconds),
        "seconds": round(seconds, 2),
        **costs(stopped),
        "topics": topics.commands,
    }


def bench_latency(config: KafkaConfig, args: argparse.Namespace, rate: int) -> dict:
    topics = fresh_topics(config, args.partitions, "lat")
    group = topics.commands + ".group"
    warm = stream(2_000 + rate * args.seconds, args.clusters, args.policy, seed=2)
    nodes = [c for c in warm if isinstance(c.payload, (AddNode, SetPolicy))]
    work = [c for c in warm if not isinstance(c.payload, (AddNode, SetPolicy))][: rate * args.seconds]
    sent: dict[str, float] = {}
    arrived: dict[str, float] = {}
    stop_reading = threading.Event()
    consumer = Consumer(
        config.client(
            {"fetch.wait.max.ms": 5},
            {"group.id": f"lat-{uuid.uuid4().hex}", "isolation.level": "read_committed", "enable.auto.commit": False},
        )
    )
    decode = registry().codec(EVENT).decode
    assignment = []
    for p in range(args.partitions):
        _, high = watermark_offsets(consumer, TopicPartition(topics.events, p))
        assignment.append(TopicPartition(topics.events, p, high))
    consumer.assign(assignment)

    def read() -> None:
        while not stop_reading.is_set():
            # poll() returns on the first record; consume(n, timeout) would wait for n or the whole timeout.
            first = consumer.poll(0.05)
            for message in [first, *consumer.consume(1000, 0)] if first is not None else []:
                if message.error() is None:
                    now = time.perf_counter()
                    command_id = decode(message.value())["command_id"]
                    arrived.setdefault(command_id, now)

    processes = start_processors(
        config, topics, group, 1, "--linger-ms", str(args.linger_ms), "--batch-size", str(args.batch_size)
    )
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    with CommandPublisher(config, topics.commands, producer_config={"linger.ms": 1}) as publisher:
        for command in nodes:
            publisher.publish(command)
        publisher.flush()
        deadline = time.perf_counter() + 60
        while nodes[-1].command_id not in arrived and time.perf_counter() < deadline:
            time.sleep(0.05)  # the processor is up and has folded the nodes
        interval = 1.0 / rate
        start = time.perf_counter()
        for index, command in enumerate(work):
            target = start + index * interval
            delay = target - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            sent[command.command_id] = time.perf_counter()
            publisher.publish(command)
        offered = len(work) / (time.perf_counter() - start)
    deadline = time.perf_counter() + 30
    while any(c.command_id not in arrived for c in work[-50:]) and time.perf_counter() < deadline:
        time.sleep(0.05)
    stop_reading.set()
    reader.join()
    consumer.close()
    stopped = stop(processes)
    latencies = sorted((arrived[k] - t) * 1000 for k, t in sent.items() if k in arrived)
    missing = len(sent) - len(latencies)

    def pct(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 2)

    return {
        "bench": "latency",
        "offered_per_s": round(offered),
        "commands": len(sent),
        "missing": missing,
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "p999_ms": pct(0.999),
        "max_ms": round(latencies[-1], 2),
        "linger_ms": args.linger_ms,
        "batch_size": args.batch_size,
        **costs(stopped),
    }


def bench_restore(config: KafkaConfig, args: argparse.Namespace) -> dict:
    """Restoring one partition from its snapshot and a 300-command tail: the reads, then the whole restore."""
    topics = fresh_topics(config, 1, "restore")
    commands = stream(3_300, 1, args.policy)
    with CommandPublisher(config, topics.commands) as publisher:
        for command in commands:
            publisher.publish(command)
    log = KafkaCommandLog(config, topics, group_id=topics.commands + ".group", instance_id="bench").start()
    try:
        processor = Processor(log, snapshot_every=1_000, batch_size=500)
        while processor.processed < len(commands):
            processor.run_batch(1.0)
        rounds: list[tuple[float, float, float]] = []
        for _ in range(3):
            started = time.perf_counter()
            frame = log.latest_snapshot(0)
            read_snapshot = time.perf_counter()
            committed_offset = log.committed(0)
            tail = sum(1 for _ in log.read_commands(0, 3_000, committed_offset))
            read_tail = time.perf_counter()
            restore_state(log, 0)
            rounds.append((read_snapshot - started, read_tail - read_snapshot, time.perf_counter() - read_tail))
        assert frame is not None and tail == 300
    finally:
        log.close()
    return {
        "bench": "restore",
        "tail": tail,
        "snapshot_read_s": [round(r[0], 3) for r in rounds],
        "tail_read_s": [round(r[1], 3) for r in rounds],
        "restore_s": [round(r[2], 3) for r in rounds],
    }


def bench_replay(config: KafkaConfig, topics_name: str, args: argparse.Namespace) -> dict:
    topics = Topics(topics_name, topics_name + ".none", topics_name + ".none", topics_name + ".none")
    consumer = Consumer(
        config.client(
            {"fetch.max.bytes": 64 << 20},
            {"group.id": f"replay-{uuid.uuid4().hex}", "enable.auto.commit": False, "enable.partition.eof": True},
        )
    )
    started = time.perf_counter()
    folded = 0
    for p in range(args.partitions):
        low, high = watermark_offsets(consumer, TopicPartition(topics.commands, p))
        if high <= low:
            continue
        consumer.assign([TopicPartition(topics.commands, p, low)])
        folder = PartitionFolder(p, topics, snapshot_every=0)
        out: list[OutputRecord] = []
        done = False
        while not done:
            for message in consumer.consume(10_000, 1.0):
                if message.error() is not None:
                    done = message.error().code() == KafkaError._PARTITION_EOF
                    continue
                folder.fold(InputRecord(p, message.offset(), message.key(), message.value()), out)
                out.clear()
                folded += 1
    seconds = time.perf_counter() - started
    consumer.close()
    return {"bench": "replay", "commands": folded, "per_s": round(folded / seconds), "seconds": round(seconds, 2)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("GPUFOLD_KAFKA_BOOTSTRAP"))
    parser.add_argument("--commands", type=int, default=100_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--clusters", type=int, default=8)
    parser.add_argument("--instances", type=int, default=2, help="processor processes in the group")
    parser.add_argument("--batch-size", type=int, default=2_000)
    parser.add_argument(
        "--rate", type=int, action="append", help="offered load of a latency run (commands/s); repeat for several"
    )
    parser.add_argument("--seconds", type=int, default=20)
    parser.add_argument("--linger-ms", type=float, default=5.0, help="the processors' --linger-ms (default: theirs)")
    parser.add_argument("--policy", default="best-fit", help="placement policy set first in every cluster")
    parser.add_argument("--only", choices=("throughput", "latency", "replay", "restore"), action="append")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if not args.bootstrap:
        parser.error("no broker: pass --bootstrap or source .services/kafka.env")
    config = load(bootstrap=args.bootstrap, environ={})
    which = args.only or ["throughput", "latency", "replay"]
    machine = f"{platform.machine()} | {os.cpu_count()} cpus | python {platform.python_version()}"
    print(f"# {machine} | load average {os.getloadavg()[0]:.2f} | {' '.join(sys.argv)}")
    rows = []
    if "throughput" in which or "replay" in which:
        row = bench_throughput(config, args)
        if "throughput" in which:
            rows.append(row)
        if "replay" in which:
            rows.append(bench_replay(config, row["topics"], args))
    if "restore" in which:
        rows.append(bench_restore(config, args))
    if "latency" in which:
        for rate in args.rate or [1_000]:
            rows.append(bench_latency(config, args, rate))
    for row in rows:
        row.pop("topics", None)
        print(json.dumps(row) if args.json else "  ".join(f"{k}={v}" for k, v in row.items()))
    print(f"# load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
