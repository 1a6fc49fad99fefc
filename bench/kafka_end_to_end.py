"""End-to-end figures on a real Kafka broker, with exactly-once on (not a test: a measurement).

Three measurements, each on fresh topics:

1. ``throughput``: pre-publish N commands (publish rate reported), then start ``--instances`` processor
   processes (``gpufold processor run``, one consumer group) and time how fast the group's committed
   offsets advance from the first commit to N: commands folded, produced and committed per second.
2. ``latency``: a processor runs; a paced publisher offers ``--rate`` commands/s for ``--seconds``; a
   read_committed consumer of the events topic stamps the arrival of each command's first event.
   Latency = arrival - the moment ``produce()`` was called. p50/p99/p99.9/max reported. With ``--stages`` the
   topics carry broker append times (``LogAppendTime``) and the processor runs with ``--trace-batches``: each
   command's time is split into publish -> appended, waiting for the processor, poll, fold, each transaction
   call, and commit -> outcome seen (p50/p99 per stage; a processor without ``--trace-batches``, e.g. an older
   checkout's, gives the broker-side split only).
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
from bisect import bisect_right
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from confluent_kafka import Consumer, KafkaError, TopicPartition

from kafka_settings.config import KafkaConfig, load
from kafka_settings.topics import create_topics, topic_specs, watermark_offsets
from logs.kafka import KafkaCommandLog
from logs.port import InputRecord, OutputRecord
from processor.runtime.loop import PartitionFolder, Processor, restore_state
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


def fresh_topics(config: KafkaConfig, partitions: int, name: str, append_time: bool = False) -> Topics:
    """New topics; ``append_time``: records carry the broker's append time (``LogAppendTime``) instead of the
    producer's, so ``--stages`` can tell when a command and its events reached the broker."""
    topics = topics_for(f"bench-{name}-{uuid.uuid4().hex[:8]}")
    specs = topic_specs(topics, partitions, 1)
    if append_time:
        specs = [replace(spec, config={**spec.config, "message.timestamp.type": "LogAppendTime"}) for spec in specs]
    create_topics(config.client(), specs)
    return topics


def traces_batches() -> bool:
    """Whether the processor next to this interpreter has ``--trace-batches`` (an older checkout may not)."""
    gpufold = str(Path(sys.executable).with_name("gpufold"))
    help_text = subprocess.run([gpufold, "processor", "run", "--help"], capture_output=True, text=True).stdout
    return "--trace-batches" in help_text


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


def stop(processes: list, batches: list[dict] | None = None) -> list[dict]:
    """SIGTERM every processor; returns the fields of each one's "processor stopped" log line (its costs).

    ``batches`` receives the processors' "batch" lines (``--trace-batches``), if given.
    """
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
                elif entry.get("msg") == "batch" and batches is not None:
                    batches.append(entry)
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


def bench_throughput(config: KafkaConfig, args: argparse.Namespace, pipelined: bool = True) -> dict:
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
    processes = start_processors(
        config, topics, group, args.instances, "--batch-size", str(args.batch_size), *pipeline_args(pipelined)
    )
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


def pipeline_args(pipelined: bool) -> list[str]:
    """The processor's flag for a run without the pipelined commit (only an older checkout lacks it: then [])."""
    if pipelined:
        return []
    gpufold = str(Path(sys.executable).with_name("gpufold"))
    help_text = subprocess.run([gpufold, "processor", "run", "--help"], capture_output=True, text=True).stdout
    if "--no-pipeline" not in help_text:
        raise SystemExit("this checkout's processor has no --no-pipeline (it never pipelines): use --pipeline on")
    return ["--no-pipeline"]


def bench_latency(config: KafkaConfig, args: argparse.Namespace, rate: int, pipelined: bool = True) -> dict:
    stages = args.stages
    topics = fresh_topics(config, args.partitions, "lat", append_time=stages)
    group = topics.commands + ".group"
    warm = stream(2_000 + rate * args.seconds, args.clusters, args.policy, seed=2)
    nodes = [c for c in warm if isinstance(c.payload, (AddNode, SetPolicy))]
    work = [c for c in warm if not isinstance(c.payload, (AddNode, SetPolicy))][: rate * args.seconds]
    sent: dict[str, float] = {}
    arrived: dict[str, float] = {}
    # --stages: wall-clock times (comparable with the processor's and the broker's), and each outcome's
    # event append time at the broker.
    sent_wall: dict[str, float] = {}
    arrived_wall: dict[str, tuple[float, float]] = {}
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
                    now, wall = time.perf_counter(), time.time()
                    command_id = decode(message.value())["command_id"]
                    arrived.setdefault(command_id, now)
                    if stages and command_id not in arrived_wall:
                        arrived_wall[command_id] = (wall, message.timestamp()[1] / 1000)

    extra = ["--linger-ms", str(args.linger_ms), "--batch-size", str(args.batch_size), *pipeline_args(pipelined)]
    traced = stages and traces_batches()
    processes = start_processors(config, topics, group, 1, *extra, *(["--trace-batches"] if traced else []))
    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    publisher_config = {"linger.ms": args.publisher_linger_ms}
    with CommandPublisher(config, topics.commands, producer_config=publisher_config) as publisher:
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
            if stages:
                sent_wall[command.command_id] = time.time()
            publisher.publish(command)
        offered = len(work) / (time.perf_counter() - start)
    deadline = time.perf_counter() + 30
    while any(c.command_id not in arrived for c in work[-50:]) and time.perf_counter() < deadline:
        time.sleep(0.05)
    stop_reading.set()
    reader.join()
    consumer.close()
    batches: list[dict] = []
    stopped = stop(processes, batches)
    latencies = sorted((arrived[k] - t) * 1000 for k, t in sent.items() if k in arrived)
    missing = len(sent) - len(latencies)

    def pct(q: float) -> float:
        return round(latencies[min(len(latencies) - 1, int(q * len(latencies)))], 2)

    row = {
        "bench": "latency",
        "pipeline": "on" if pipelined else "off",
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
    if stages:
        appended = command_append_times(config, topics, args.partitions)
        row["stages_ms"] = stage_breakdown(sent_wall, appended, batches, arrived_wall)
        row["processor_traced"] = traced
    return row


def command_append_times(config: KafkaConfig, topics: Topics, partitions: int) -> dict[str, tuple[int, int, float]]:
    """Every command's (partition, offset, broker append time in s), read back from its LogAppendTime topic."""
    consumer = Consumer(
        config.client(
            {"fetch.max.bytes": 64 << 20},
            {"group.id": f"stages-{uuid.uuid4().hex}", "enable.auto.commit": False, "enable.partition.eof": True},
        )
    )
    decode = registry().codec(COMMAND).decode
    found: dict[str, tuple[int, int, float]] = {}
    try:
        for p in range(partitions):
            low, high = watermark_offsets(consumer, TopicPartition(topics.commands, p))
            if high <= low:
                continue
            consumer.assign([TopicPartition(topics.commands, p, low)])
            done = False
            while not done:
                for message in consumer.consume(10_000, 1.0):
                    if message.error() is not None:
                        done = message.error().code() == KafkaError._PARTITION_EOF
                        continue
                    command_id = decode(message.value())["command_id"]
                    found[command_id] = (p, message.offset(), message.timestamp()[1] / 1000)
    finally:
        consumer.close()
    return found


def stage_breakdown(
    sent: dict[str, float],
    appended: dict[str, tuple[int, int, float]],
    batches: list[dict],
    arrived: dict[str, tuple[float, float]],
) -> dict[str, list[float]]:
    """[p50, p99] in ms of each stage a command went through, from wall-clock marks of three processes.

    Broker times (``LogAppendTime``) have 1 ms resolution. A command's batch is the first traced batch whose
    position on its partition is past its offset. Stages of one command add up to its total; their p99s do not.
    """
    # partition -> sorted batch positions, and the batch (its marks) at each.
    ends: dict[int, list[int]] = {}
    at: dict[tuple[int, int], dict[str, float]] = {}
    for batch in batches:
        for partition, position in batch["positions"].items():
            ends.setdefault(int(partition), []).append(position)
            at[(int(partition), position)] = batch["marks"]
    for positions in ends.values():
        positions.sort()
    series: dict[str, list[float]] = {}
    first_append: dict[float, float] = {}  # per batch polled by an idle processor: its first command's append
    first_out: dict[float, float] = {}

    def add(stage: str, seconds: float) -> None:
        series.setdefault(stage, []).append(seconds * 1000)

    for command_id, published in sent.items():
        if command_id not in appended or command_id not in arrived:
            continue
        partition, offset, append = appended[command_id]
        seen, event_append = arrived[command_id]
        add("total", seen - published)
        add("publish->command appended", append - published)
        add("command appended->event appended", event_append - append)
        add("event appended->outcome seen", seen - event_append)
        positions = ends.get(partition)
        if not positions:
            continue
        index = bisect_right(positions, offset)
        if index == len(positions):
            continue
        marks = at[(partition, positions[index])]
        # Before its batch's poll began the processor was busy with the previous batch (or restoring).
        add("appended->poll began (processor busy)", max(0.0, marks["poll"] - append))
        add("poll: ->batch cut (fetch + linger)", marks["polled"] - max(append, marks["poll"]))
        if marks["first"] > marks["poll"] + 0.0005:  # the processor waited in poll: when did the first come out?
            key = marks["poll"]
            first_append[key] = min(first_append.get(key, append), append)
            first_out[key] = marks["first"]
        folded, began = marks.get("folded", marks["commit"]), marks.get("txn", marks["commit"])
        add("fold", folded - marks["polled"])
        if "txn" in marks:  # pipelined: the transaction begins once the previous one has committed
            add("folded->transaction began (previous commit)", began - folded)
        add("produce (enqueue)", marks["produced"] - began)
        add("send_offsets_to_transaction", marks["offsets_sent"] - marks["produced"])
        add("commit_transaction", marks["committed"] - marks["offsets_sent"])
        add("committed->outcome seen", seen - marks["committed"])

    for key, append in first_append.items():  # one value per batch polled by an idle processor (often few)
        add(f"  idle poll ({len(first_append)} batches): first appended->fetched", first_out[key] - append)

    def pcts(values: list[float]) -> list[float]:
        values.sort()
        return [round(values[min(len(values) - 1, int(q * len(values)))], 2) for q in (0.5, 0.99)]

    return {stage: pcts(values) for stage, values in series.items()}


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
    parser.add_argument(
        "--publisher-linger-ms", type=float, default=1.0, help="the latency run's publisher linger.ms (default 1)"
    )
    parser.add_argument(
        "--stages",
        action="store_true",
        help="latency runs also print p50/p99 per stage (publish, broker append, poll, fold, each transaction "
        "call, outcome seen), from broker append times and the processor's --trace-batches lines",
    )
    parser.add_argument(
        "--pipeline",
        choices=("on", "off", "both"),
        default="on",
        help="the processors fold the next batch while a transaction commits (on, their default), or not "
        "(off: --no-pipeline); both: each throughput and latency run twice, off then on, in the same run",
    )
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
    modes = {"on": [True], "off": [False], "both": [False, True]}[args.pipeline]
    if "throughput" in which or "replay" in which:
        for pipelined in modes if "throughput" in which else [True]:
            row = bench_throughput(config, args, pipelined)
            row["pipeline"] = "on" if pipelined else "off"
            if "throughput" in which:
                rows.append(row)
        if "replay" in which:
            rows.append(bench_replay(config, row["topics"], args))
    if "restore" in which:
        rows.append(bench_restore(config, args))
    if "latency" in which:
        for rate in args.rate or [1_000]:
            for pipelined in modes:
                rows.append(bench_latency(config, args, rate, pipelined))
    for row in rows:
        row.pop("topics", None)
        stage_rows = row.pop("stages_ms", None)
        if args.json:
            print(json.dumps({**row, **({"stages_ms": stage_rows} if stage_rows else {})}))
        else:
            print("  ".join(f"{k}={v}" for k, v in row.items()))
        if stage_rows and not args.json:
            print(f"  {'stage (per command)':<48} {'p50 ms':>9} {'p99 ms':>9}")
            for stage, (p50, p99) in stage_rows.items():
                print(f"  {stage:<48} {p50:>9.2f} {p99:>9.2f}")
    print(f"# load average after: {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
