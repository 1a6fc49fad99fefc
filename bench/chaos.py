"""Broker, coordinator and database faults while commands flow, then proof from the topics that nothing slipped.

A soak, not a benchmark: against a 3-node KRaft cluster (``scripts/kafka.sh start --brokers 3``: replication 3,
``min.insync.replicas`` 2) and PostgreSQL (``scripts/postgres.sh``), a paced publisher offers commands while one
``gpufold processor run`` folds them and one ``gpufold projector run`` projects the events. Meanwhile, one fault
at a time (each waits until every replica is back in sync, so no fault ever costs a second replica):

- SIGKILL the leader of a commands partition (``--leader-kills``), then start that node again;
- SIGKILL the processor's transaction coordinator, the leader of its ``__transaction_state`` partition
  (``--coordinator-kills``), then start it again;
- SIGSTOP a node for ``--stop-seconds``, then SIGCONT it;
- ``scripts/postgres.sh restart`` under the projector's load (``--postgres-restarts``).

Then, from the topics alone: every command published is on the commands topic once (0 lost, 0 duplicated);
every event is byte-identical to a local re-fold of the commands topic, one outcome per command, gap-free
sequences, the same state hash (``tests/integration/kafka_support.check_exactly_once``); the processor and the
projector never exited (they ride the faults out) and stop with status 0 on SIGTERM; and the projection equals a
rebuild from offset 0 (``gpufold projections rebuild``).

Usage (the full soak; ``tests/integration/test_kafka_chaos.py`` runs a CI-sized one)::

    bash scripts/postgres.sh start && source .services/postgres.env
    python bench/chaos.py [--rate 300] [--leader-kills 5] [--coordinator-kills 5] [--stop-seconds 20] [--json]

It starts the 3-node cluster itself (in ``--kafka-run-dir``, default ``.services``: pids in
``.services/kafka/broker-<id>.pid``) and leaves it running; ``bash scripts/kafka.sh stop`` stops it.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import quote

from confluent_kafka.admin import AdminClient

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests" / "integration"))

import kafka_support  # noqa: E402  (tests/integration: the same checks as the crash tests)

from kafka_settings.topics import create_topics, topic_specs  # noqa: E402
from producers.publisher import CommandPublisher  # noqa: E402
from schemas import COMMAND, registry  # noqa: E402
from schemas.topics import Topics, topics_for  # noqa: E402

GPUFOLD = str(Path(sys.executable).with_name("gpufold"))
TRANSACTION_STATE_PARTITIONS = 10  # transaction.state.log.num.partitions in scripts/kafka.sh's cluster config


@dataclass
class Plan:
    """What the soak does. The defaults are the full soak of issue #21; the CI test shrinks them."""

    rate: float = 300.0
    """Commands offered per second while the faults run (and ``settle`` seconds before and after)."""
    partitions: int = 3
    leader_kills: int = 5
    coordinator_kills: int = 5
    stop_seconds: float = 20.0
    """How long a node stays SIGSTOPped (0: no stop)."""
    postgres_restarts: int = 1
    down_seconds: float = 3.0
    """How long a killed node stays down before it is started again."""
    settle: float = 3.0
    batch_size: int = 500
    snapshot_every: int = 2_000
    transaction_timeout_ms: int = 10_000
    seed: int = 21
    kafka_run_dir: Path = REPO / ".services"
    postgres_run_dir: Path | None = None
    """The run dir of ``scripts/postgres.sh`` (default: $GPUFOLD_RUN_DIR, else .services)."""
    work_dir: Path | None = None
    """Where the processor's and projector's logs go (default: a new directory under the kafka run dir)."""


@dataclass
class Report:
    published: int = 0
    events: int = 0
    dead_letters: int = 0
    faults: list[dict[str, object]] = field(default_factory=list)
    aborted_batches: int = 0
    seconds: float = 0.0
    logs: str = ""


class ChaosError(AssertionError):
    """A check failed: something was lost, duplicated, differs, or a process gave up."""


def _say(message: str) -> None:
    print(f"chaos: {message}", file=sys.stderr, flush=True)


# ------------------------------------------------------------------ the cluster


class Cluster:
    """The N-node cluster of ``scripts/kafka.sh start --brokers N`` in one run dir: who leads what, and faults."""

    def __init__(self, run_dir: Path, brokers: int = 3) -> None:
        self.run_dir = run_dir
        self.brokers = brokers
        self.bootstrap = self.start()
        self.admin = AdminClient({"bootstrap.servers": self.bootstrap, "logger": kafka_support.RDKAFKA_LOG})

    def _script(self, *argv: str, timeout: float = 240) -> str:
        env = {**os.environ, "GPUFOLD_RUN_DIR": str(self.run_dir)}
        result = subprocess.run(["bash", str(REPO / "scripts" / "kafka.sh"), *argv], cwd=REPO, env=env,
                                capture_output=True, text=True, timeout=timeout, check=False)  # fmt: skip
        if result.returncode != 0:
            raise ChaosError(f"scripts/kafka.sh {' '.join(argv)} failed:\n{result.stderr[-3000:]}")
        return result.stdout.strip()

    def start(self) -> str:
        """Start the nodes that are not running (all of them the first time); the bootstrap list."""
        return self._script("start", "--brokers", str(self.brokers)).splitlines()[-1]

    def pid(self, node: int) -> int:
        return int((self.run_dir / "kafka" / f"broker-{node}.pid").read_text())

    def leader(self, topic: str, partition: int) -> int:
        deadline = time.monotonic() + 60
        while True:
            try:
                leader = self.admin.list_topics(topic, timeout=10).topics[topic].partitions[partition].leader
            except Exception:  # a node just killed: ask again
                leader = -1
            if leader > 0:
                return leader
            if time.monotonic() > deadline:
                raise ChaosError(f"{topic}[{partition}] has no leader after 60 s")
            time.sleep(0.2)

    def transaction_coordinator(self, transactional_id: str) -> int:
        """The node leading the ``__transaction_state`` partition of ``transactional_id`` (Kafka's partitionFor:
        abs(String.hashCode) mod transaction.state.log.num.partitions)."""
        return self.leader("__transaction_state", java_partition(transactional_id, TRANSACTION_STATE_PARTITIONS))

    def in_sync(self) -> bool:
        """Every partition of every topic (internal ones too) has all its replicas in sync and a leader."""
        try:
            metadata = self.admin.list_topics(timeout=10)
        except Exception:  # a node just killed: not in sync
            return False
        if len(metadata.brokers) < self.brokers:
            return False
        for topic in metadata.topics.values():
            for partition in topic.partitions.values():
                if partition.leader < 0 or len(partition.isrs) < len(partition.replicas):
                    return False
        return True

    def wait_in_sync(self, timeout: float = 180) -> float:
        started = time.monotonic()
        while not self.in_sync():
            if time.monotonic() - started > timeout:
                raise ChaosError(f"the cluster's replicas were not all back in sync within {timeout:g} s")
            time.sleep(0.5)
        return time.monotonic() - started

    def kill(self, node: int, down: float) -> None:
        os.kill(self.pid(node), signal.SIGKILL)
        time.sleep(down)
        self.start()

    def pause(self, node: int, seconds: float) -> None:
        pid = self.pid(node)
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)


def java_partition(text: str, partitions: int) -> int:
    """Kafka's ``Utils.abs(text.hashCode) % partitions`` (Java's String.hashCode over UTF-16 code units)."""
    value = 0
    data = text.encode("utf-16-be")
    for index in range(0, len(data), 2):
        value = (31 * value + int.from_bytes(data[index : index + 2], "big")) & 0xFFFFFFFF
    if value >= 1 << 31:
        value -= 1 << 32
    return (0 if value == -(1 << 31) else abs(value)) % partitions


# ------------------------------------------------------------------ the load


class PacedPublisher(threading.Thread):
    """Publishes ``kafka_support.command_stream`` at ``rate`` commands/s until stopped."""

    def __init__(self, bootstrap: str, topics: Topics, rate: float, seed: int) -> None:
        super().__init__(name="chaos-publisher", daemon=True)
        self.publisher = CommandPublisher(kafka_support.kafka_config(bootstrap), topics.commands)
        self.rate = rate
        self.seed = seed
        self.published: list[str] = []
        self.error: BaseException | None = None
        self._stop_event = threading.Event()

    def run(self) -> None:
        try:
            started = time.monotonic()
            chunk = 64
            stream = kafka_support.command_stream(chunk * 8, clusters=6, seed=self.seed)
            while not self._stop_event.is_set():
                if len(self.published) >= len(stream):
                    stream = kafka_support.command_stream(len(stream) * 2, clusters=6, seed=self.seed)
                for command in stream[len(self.published) : len(self.published) + chunk]:
                    self.publisher.publish(command)
                    self.published.append(command.command_id)
                due = started + len(self.published) / self.rate
                time.sleep(max(0.0, due - time.monotonic()))
            self.publisher.flush(300)
        except BaseException as error:  # reported by finish()
            self.error = error

    def finish(self) -> list[str]:
        self._stop_event.set()
        self.join(360)
        if self.is_alive():
            raise ChaosError("the publisher did not flush its commands within 360 s")
        if self.error is not None:
            raise ChaosError(f"publishing failed: {self.error!r}")
        self.publisher.close(60)
        return self.published


def _with_search_path(url: str, schema: str) -> str:
    separator = "&" if "?" in url else "?"
    return f"{url}{separator}options={quote(f'-csearch_path={schema}')}"


def _database_url(plan: Plan) -> str:
    url = os.environ.get("GPUFOLD_DATABASE_URL", "")
    if url:
        return url
    env = _postgres_run_dir(plan) / "postgres.env"
    if env.exists():
        for line in env.read_text().splitlines():
            if line.startswith("export GPUFOLD_DATABASE_URL="):
                return line.split("=", 1)[1].strip().strip("'\"")
    raise ChaosError("no PostgreSQL: set GPUFOLD_DATABASE_URL or run `bash scripts/postgres.sh start` first")


def _postgres_run_dir(plan: Plan) -> Path:
    return plan.postgres_run_dir or Path(os.environ.get("GPUFOLD_RUN_DIR", REPO / ".services"))


def _restart_postgres(plan: Plan) -> None:
    env = {**os.environ, "GPUFOLD_RUN_DIR": str(_postgres_run_dir(plan))}
    result = subprocess.run(["bash", str(REPO / "scripts" / "postgres.sh"), "restart"], cwd=REPO, env=env,
                            capture_output=True, text=True, timeout=180, check=False)  # fmt: skip
    if result.returncode != 0:
        raise ChaosError(f"scripts/postgres.sh restart failed:\n{result.stderr[-3000:]}")


def _applied(engine: object) -> int:
    from sqlalchemy import text

    with engine.connect() as conn:  # type: ignore[attr-defined]
        try:
            return int(conn.execute(text("SELECT coalesce(sum(next_sequence), 0) FROM projection_offsets")).scalar())
        except Exception:  # no tables yet, or the server is restarting
            return -1


def _wait(predicate: Callable[[], bool], timeout: float, what: str, alive: Callable[[], str | None]) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        gone = alive()
        if gone:
            raise ChaosError(gone)
        if time.monotonic() > deadline:
            raise ChaosError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.2)


# ------------------------------------------------------------------ the soak


def run(plan: Plan) -> Report:
    """Run the soak; raises :class:`ChaosError` when anything was lost, duplicated, differs, or gave up."""
    from sqlalchemy import create_engine, text

    started = time.monotonic()
    rng = random.Random(plan.seed)
    report = Report()
    _say(f"starting the 3-node cluster in {plan.kafka_run_dir}")
    cluster = Cluster(plan.kafka_run_dir)
    cluster.wait_in_sync()
    bootstrap = cluster.bootstrap
    prefix = f"chaos-{uuid.uuid4().hex[:8]}"
    topics = topics_for(prefix)
    create_topics(kafka_support.kafka_config(bootstrap).client(), topic_specs(topics, plan.partitions, 3, 2))
    work = plan.work_dir or plan.kafka_run_dir / prefix
    work.mkdir(parents=True, exist_ok=True)
    report.logs = str(work)
    group = f"{prefix}.processor"
    instance = "chaos"
    transactional_id = f"{group}.{instance}"

    database_url = _database_url(plan)
    schema = f"chaos_{uuid.uuid4().hex[:10]}"
    admin_engine = create_engine(database_url, pool_pre_ping=True)
    with admin_engine.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    schema_url = _with_search_path(database_url, schema)
    engine = create_engine(schema_url, pool_pre_ping=True)

    processor_log = work / "processor.log"
    projector_log = work / "projector.log"
    processor = subprocess.Popen(
        [GPUFOLD, "processor", "run", "--bootstrap", bootstrap, "--topic-prefix", prefix, "--group", group,
         "--instance-id", instance, "--batch-size", str(plan.batch_size), "--snapshot-every",
         str(plan.snapshot_every), "--transaction-timeout-ms", str(plan.transaction_timeout_ms)],
        cwd=REPO, stderr=open(processor_log, "ab"),  # noqa: SIM115
    )  # fmt: skip
    projector = subprocess.Popen(
        [GPUFOLD, "-v", "projector", "run", "--bootstrap", bootstrap, "--topic", topics.events, "--group",
         f"{prefix}.projector", "--database-url", schema_url, "--batch-size", str(plan.batch_size)],
        cwd=REPO, stdout=subprocess.DEVNULL, stderr=open(projector_log, "ab"),  # noqa: SIM115
    )  # fmt: skip

    def alive() -> str | None:
        for name, process, log in (("processor", processor, processor_log), ("projector", projector, projector_log)):
            if process.poll() is not None:
                return f"the {name} exited with {process.returncode} during the soak; see {log}"
        return None

    publisher = PacedPublisher(bootstrap, topics, plan.rate, plan.seed)
    watcher = kafka_support.CommittedWatcher(bootstrap, topics, group, plan.partitions)
    try:
        publisher.start()
        _wait(lambda: watcher.total() > plan.rate, 120, "the processor's first commits", alive)

        faults: list[str] = ["leader"] * plan.leader_kills + ["coordinator"] * plan.coordinator_kills
        rng.shuffle(faults)
        if plan.stop_seconds > 0:
            faults.insert(len(faults) // 2, "stop")
        for index in range(plan.postgres_restarts):
            faults.insert((index + 1) * len(faults) // (plan.postgres_restarts + 1), "postgres")
        for number, kind in enumerate(faults):
            time.sleep(plan.settle)
            gone = alive()
            if gone:
                raise ChaosError(gone)
            at = round(time.monotonic() - started, 1)
            entry: dict[str, object] = {"fault": kind, "at": at, "committed": watcher.total()}
            begun = time.monotonic()
            if kind == "leader":
                partition = number % plan.partitions
                node = cluster.leader(topics.commands, partition)
                entry.update(node=node, partition=partition)
                _say(f"SIGKILL node {node}, leader of {topics.commands}[{partition}]")
                cluster.kill(node, plan.down_seconds)
            elif kind == "coordinator":
                node = cluster.transaction_coordinator(transactional_id)
                entry.update(node=node)
                _say(f"SIGKILL node {node}, transaction coordinator of {transactional_id}")
                cluster.kill(node, plan.down_seconds)
            elif kind == "stop":
                node = cluster.leader(topics.events, 0)
                entry.update(node=node, seconds=plan.stop_seconds)
                _say(f"SIGSTOP node {node} for {plan.stop_seconds:g} s")
                cluster.pause(node, plan.stop_seconds)
            else:
                with_load = _applied(engine)
                _say(f"scripts/postgres.sh restart (projector at {with_load} events)")
                _restart_postgres(plan)
            entry["seconds"] = round(time.monotonic() - begun, 1)
            entry["resync_seconds"] = round(cluster.wait_in_sync(), 1)
            report.faults.append(entry)
        time.sleep(plan.settle)
        published = publisher.finish()
        report.published = len(published)
        _say(f"{len(published)} commands published; waiting for the processor to fold them all")
        _wait(lambda: watcher.total() >= len(published), 300, f"{len(published)} commands committed", alive)
        if watcher.total() != len(published):
            raise ChaosError(f"{watcher.total()} commands committed, {len(published)} published")

        commands = kafka_support.read_topic(bootstrap, topics.commands)
        decode = registry().codec(COMMAND).decode
        ids = [decode(record.value)["command_id"] for records in commands.values() for record in records]
        lost = set(published) - set(ids)
        duplicated = len(ids) - len(set(ids))
        if lost or duplicated or len(ids) != len(published):
            raise ChaosError(f"commands topic: {len(lost)} lost, {duplicated} duplicated of {len(published)}")
        expected = kafka_support.check_exactly_once(bootstrap, topics)  # byte-identical to a local re-fold
        report.events = sum(len(values) for values in expected.events.values())
        report.dead_letters = sum(len(values) for values in expected.dead_letters.values())

        _wait(lambda: _applied(engine) >= report.events, 300, f"the projector to apply {report.events} events", alive)
        if _applied(engine) != report.events:
            raise ChaosError(f"the projection holds {_applied(engine)} events, the topic {report.events}")
    finally:
        watcher.close()
        statuses = {}
        for name, process in (("processor", processor), ("projector", projector)):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
            try:
                statuses[name] = process.wait(90)
            except subprocess.TimeoutExpired:
                process.kill()
                statuses[name] = process.wait()
    for name, status in statuses.items():
        if status != 0:
            raise ChaosError(f"the {name} exited with {status}; see {work}")

    rebuild = subprocess.run(
        [GPUFOLD, "projections", "rebuild", "--bootstrap", bootstrap, "--topic", topics.events, "--database-url",
         schema_url, "--schema", f"rb_{schema}"],
        cwd=REPO, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if rebuild.returncode != 0 or '"equal": true' not in rebuild.stdout:
        raise ChaosError(f"the projection differs from a rebuild:\n{rebuild.stdout[-2000:]}{rebuild.stderr[-2000:]}")
    engine.dispose()
    with admin_engine.begin() as conn:
        conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        conn.execute(text(f'DROP SCHEMA IF EXISTS "rb_{schema}" CASCADE'))
    admin_engine.dispose()
    report.aborted_batches = processor_log.read_text().count("batch aborted")
    report.seconds = round(time.monotonic() - started, 1)
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    defaults = Plan()
    parser.add_argument("--rate", type=float, default=defaults.rate)
    parser.add_argument("--partitions", type=int, default=defaults.partitions)
    parser.add_argument("--leader-kills", type=int, default=defaults.leader_kills)
    parser.add_argument("--coordinator-kills", type=int, default=defaults.coordinator_kills)
    parser.add_argument("--stop-seconds", type=float, default=defaults.stop_seconds)
    parser.add_argument("--postgres-restarts", type=int, default=defaults.postgres_restarts)
    parser.add_argument("--down-seconds", type=float, default=defaults.down_seconds)
    parser.add_argument("--settle", type=float, default=defaults.settle)
    parser.add_argument("--seed", type=int, default=defaults.seed)
    parser.add_argument("--kafka-run-dir", type=Path, default=defaults.kafka_run_dir)
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args(argv)
    plan = Plan(
        rate=args.rate, partitions=args.partitions, leader_kills=args.leader_kills,
        coordinator_kills=args.coordinator_kills, stop_seconds=args.stop_seconds,
        postgres_restarts=args.postgres_restarts, down_seconds=args.down_seconds, settle=args.settle,
        seed=args.seed, kafka_run_dir=args.kafka_run_dir,
    )  # fmt: skip
    try:
        report = run(plan)
    except ChaosError as error:
        _say(f"FAILED: {error}")
        return 1
    if args.json:
        print(json.dumps(asdict(report), indent=2))
    else:
        for fault in report.faults:
            print(json.dumps(fault))
        print(
            f"{report.published} commands published, 0 lost, 0 duplicated; {report.events} events byte-identical to "
            f"the re-fold; {report.dead_letters} dead letters; {report.aborted_batches} batches aborted and retried; "
            f"projection equal to a rebuild; {report.seconds:g} s (logs: {report.logs})"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
