"""``gpufold serve``'s options and start-up: which log the replica follows and the writes go to.

- ``--bootstrap`` (or ``GPUFOLD_KAFKA_BOOTSTRAP`` when no ``--log`` is given): Kafka. The replica reads the commands and
  snapshots topics; writes go through ``CommandPublisher``; the processor runs elsewhere (health reads its group's
  committed offsets).
- ``--log`` (or ``GPUFOLD_LOG``), or nothing at all: the embedded log (a missing one only with ``--create``). The
  server also runs the processor on it in a thread (``--no-processor`` to leave that to ``gpufold run``) and, with
  ``--database-url``, the projector (``--no-projector`` to leave that to ``gpufold projector run``), so submitting,
  waiting and watching work on one machine with no servers, and every route follows the log.
- ``--database-url`` alone (the old form): the projections' read API only, plus the dashboard page.

``GPUFOLD_API_TOKEN``, when set, is the bearer token every write needs; set but empty is an error, and writes on
an address other than loopback need one.
"""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from typing import Any

from gpufold.cli import CliError

TOKEN_ENV = "GPUFOLD_API_TOKEN"
AUTH_HELP = f"""auth: set {TOKEN_ENV} and every write (POST /v1/commands and the typed routes) needs
  Authorization: Bearer <token>; reads, what-if, /healthz and /metrics stay open. {TOKEN_ENV}="" is an
  error, and serve refuses to open writes on an address other than loopback (--host 0.0.0.0) without a
  token: set one, or pass --read-only."""


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    from gpufold.cli_commands._embedded import LOG_HELP
    from gpufold.server.body_guard import DEFAULT_MAX_BODY
    from gpufold.server.health import DEFAULT_MAX_LAG_SECONDS
    from gpufold.server.whatif_process import DEFAULT_MAX_BYTES, DEFAULT_SECONDS

    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.epilog = AUTH_HELP
    group = parser.add_argument_group("the live replica and the write API")
    group.add_argument("--log", metavar="PATH", default=None, help=LOG_HELP)
    group.add_argument(
        "--bootstrap", metavar="HOST:PORT", default=None, help="Kafka (default: $GPUFOLD_KAFKA_BOOTSTRAP)"
    )
    group.add_argument("--kafka-config", metavar="FILE", default=None, help="librdkafka properties file")
    group.add_argument("--topic-prefix", default="gpufold", help="Kafka topic prefix (default: %(default)s)")
    group.add_argument(
        "--processor-group",
        default="gpufold-processor",
        help="Kafka: the processor's consumer group, whose committed offsets health reads (default: %(default)s)",
    )
    group.add_argument(
        "--no-processor", action="store_true", help="embedded log: do not fold in this process (gpufold run does)"
    )
    group.add_argument(
        "--no-projector",
        action="store_true",
        help="embedded log with --database-url: do not project in this process (gpufold projector run does)",
    )
    group.add_argument("--read-only", action="store_true", help="no write API (reads and what-if only)")
    group.add_argument("--create", action="store_true", help="embedded log: create it if it does not exist yet")
    group.add_argument(
        "--tick-interval",
        type=float,
        default=0.0,
        metavar="SECONDS",
        help="embedded log: append a Tick to each partition this often, so time limits, timeouts and "
        "reservations fire when no command moves event time (default: 0, never; on Kafka: processor run's)",
    )
    limits = parser.add_argument_group("limits and health")
    limits.add_argument(
        "--max-body-bytes",
        type=int,
        default=DEFAULT_MAX_BODY,
        metavar="BYTES",
        help="largest request body, checked while reading and after auth (default: %(default)s)",
    )
    limits.add_argument(
        "--what-if-seconds",
        type=float,
        default=DEFAULT_SECONDS,
        metavar="SECONDS",
        help="time budget of one what-if (default: %(default)s)",
    )
    limits.add_argument(
        "--what-if-max-bytes",
        type=int,
        default=DEFAULT_MAX_BYTES,
        metavar="BYTES",
        help="largest what-if answer (default: %(default)s)",
    )
    limits.add_argument(
        "--max-lag-seconds",
        type=float,
        default=DEFAULT_MAX_LAG_SECONDS,
        metavar="SECONDS",
        help="/healthz answers 503 when the fold, the replica or the projection is this far behind "
        "(default: %(default)s)",
    )


def api_token(environ: dict[str, str] | os._Environ[str] = os.environ) -> str | None:
    """The write token from the environment; set but empty (or blank) is an error, never "no auth"."""
    if TOKEN_ENV not in environ:
        return None
    token = environ[TOKEN_ENV]
    if not token.strip():
        raise CliError(f"{TOKEN_ENV} is set but empty: set a token, or unset it to serve without auth on loopback")
    if token != token.strip():
        raise CliError(f"{TOKEN_ENV} starts or ends with whitespace: remove it (the header's token would not match)")
    return token


def is_loopback(host: str) -> bool:
    if host in ("localhost", "ip6-localhost"):
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_limits(args: argparse.Namespace) -> None:
    for name, low in (("max_body_bytes", 1), ("what_if_max_bytes", 1)):
        if getattr(args, name) < low:
            raise CliError(f"--{name.replace('_', '-')} must be >= {low}")
    for name in ("what_if_seconds", "max_lag_seconds"):
        if getattr(args, name) <= 0:
            raise CliError(f"--{name.replace('_', '-')} must be > 0 seconds")


def build(args: argparse.Namespace, database_url: str | None) -> tuple[Any, list[Any], str]:
    """(app, things to stop, a description of the backend) for the parsed ``serve`` arguments."""
    from gpufold.server.app import create_app
    from gpufold.server.health import HealthMonitor, Probes
    from gpufold.server.whatif_process import Budget
    from processor.runtime.replica import Replica

    check_limits(args)
    token = api_token()
    host = getattr(args, "host", "127.0.0.1")
    # Flags before the environment: --log wins over $GPUFOLD_KAFKA_BOOTSTRAP, --bootstrap over $GPUFOLD_LOG.
    bootstrap = args.bootstrap or (None if args.log else os.environ.get("GPUFOLD_KAFKA_BOOTSTRAP"))
    embedded_path = args.log or os.environ.get("GPUFOLD_LOG")
    writes = not args.read_only and bool(bootstrap or embedded_path or not database_url)
    if writes and token is None and not is_loopback(host):
        raise CliError(
            f"refusing to open writes on {host} without a token: set {TOKEN_ENV}, pass --read-only, "
            "or listen on 127.0.0.1"
        )
    if args.tick_interval < 0:
        raise CliError("--tick-interval must be >= 0 seconds")
    stoppable: list[Any] = []
    writer: Any = None
    replica: Replica | None = None
    probes = Probes()
    if bootstrap:
        from kafka_settings.config import KafkaConfigError, install_secret_filter, load
        from logs.kafka_replica import KafkaReplicaSource
        from schemas.topics import topics_for

        try:
            config = load(args.kafka_config, bootstrap=bootstrap)
        except KafkaConfigError as error:
            raise CliError(str(error)) from None
        install_secret_filter()
        topics = topics_for(args.topic_prefix)
        try:
            source = KafkaReplicaSource(config, topics)
        except ValueError as error:
            raise CliError(str(error)) from None
        replica = Replica(source).start()
        if not args.read_only:
            from gpufold.server.writers import KafkaWriter

            writer = KafkaWriter(config, topics, source.partition_count())
        probes.fold_where = f"Kafka group {args.processor_group}"
        probes.fold_positions = _kafka_positions(config, topics.commands, args.processor_group)
        backend = f"Kafka {config.scrub(bootstrap)} (topics {args.topic_prefix}.*)"
    elif embedded_path or not database_url:
        from gpufold.cli_commands._embedded import log_path
        from gpufold.server.embedded_processor import EmbeddedProcessor
        from gpufold.server.writers import EmbeddedWriter
        from logs.embedded import EmbeddedLog, LogError
        from logs.embedded_replica import EmbeddedReplicaSource

        path = log_path(args)
        try:
            # Only with --create: a mistyped --log must not start an empty second log.
            EmbeddedLog(path, create=args.create).close()  # exists now, so the replica can open it read-only
            writer = None if args.read_only else EmbeddedWriter(path)
            replica = Replica(EmbeddedReplicaSource(path)).start()
        except LogError as error:
            hint = " (pass --create to start an empty one)" if "no log at" in str(error) else ""
            raise CliError(f"{error}{hint}") from None
        probes.fold_positions = _embedded_positions(path)
        if not args.no_processor:
            probes.fold_thread = EmbeddedProcessor(path, tick_interval=args.tick_interval).start()
            stoppable.append(probes.fold_thread)
            probes.fold_where = "in this process"
        else:
            probes.fold_where = f"gpufold run --log {path} (another process)"
        backend = f"embedded log {path}" + ("" if args.no_processor else " (processor running in this process)")
        if database_url and not args.no_projector:
            from sqlalchemy import create_engine

            from gpufold.server.embedded_projector import EmbeddedProjector, use_wal

            engine = create_engine(database_url)
            use_wal(engine)
            probes.projector_thread = EmbeddedProjector(path, engine).start()
            stoppable.append(probes.projector_thread)
            backend += ", projecting into the database"
    else:
        backend = "projections only (no --log or --bootstrap: no replica, no writes)"
    if replica is not None:
        stoppable.append(replica)
    if writer is not None:
        stoppable.append(writer)
    health = None
    if replica is not None:
        probes.replica = replica
        if database_url:
            probes.projection = _projection_probe(database_url)
        health = HealthMonitor(probes, args.max_lag_seconds).start()
        stoppable.append(health)
    app = create_app(
        database=database_url,
        replica=replica,
        writer=writer,
        token=token,
        max_body=args.max_body_bytes,
        health=health,
        what_if_budget=Budget(args.what_if_seconds, args.what_if_max_bytes),
    )
    if token and writer is not None:
        backend += "; writes need the bearer token"
    return app, stoppable, backend


def _embedded_positions(path: Any) -> Any:
    """The processor's committed next offset per partition of an embedded log (read-only; one handle per thread)."""
    import threading

    from logs.embedded import EmbeddedLog

    local = threading.local()

    def positions() -> dict[int, int]:
        handle = getattr(local, "log", None)
        if handle is None:
            handle = local.log = EmbeddedLog(path, readonly=True)
        return {p: handle.committed(p) for p in range(handle.partitions)}

    return positions


def _kafka_positions(config: Any, topic: str, group: str) -> Any:
    """The processor group's committed offsets (an OffsetFetch: the group is never joined)."""
    from confluent_kafka import Consumer, TopicPartition

    consumer: list[Any] = []

    def positions() -> dict[int, int]:
        if not consumer:
            consumer.append(Consumer(config.client({}, {"group.id": group, "enable.auto.commit": False})))
        client = consumer[0]
        partitions = sorted(client.list_topics(topic, timeout=5).topics[topic].partitions)
        committed = client.committed([TopicPartition(topic, p) for p in partitions], timeout=5)
        return {tp.partition: max(0, tp.offset) for tp in committed}

    return positions


def _projection_probe(database_url: str) -> Any:
    """The projection's offsets and per-cluster watermarks (``projections.queries.status``)."""
    from sqlalchemy import create_engine

    from projections import queries

    engine = create_engine(database_url, pool_pre_ping=True)

    def probe() -> dict[str, Any]:
        with engine.connect() as conn:
            status = queries.status(conn)
        return {"database": "reachable", **status}

    return probe


def _freeze_when_restored(stoppable: list[Any]) -> None:
    """Once the replica holds the restored state, move it out of the cyclic collector's sight.

    A replica of 100k pods is millions of long-lived objects; every full collection would walk
    them all (pauses of hundreds of ms in the middle of a request). ``gc.freeze`` exempts the
    objects that exist now; what the replica allocates later is collected as usual.
    """
    import gc
    import threading

    from processor.runtime.replica import Replica

    replicas = [item for item in stoppable if isinstance(item, Replica)]

    def wait_and_freeze() -> None:
        for replica in replicas:
            replica.restored.wait()
        gc.collect()
        gc.freeze()

    if replicas:
        threading.Thread(target=wait_and_freeze, name="gpufold-gc-freeze", daemon=True).start()


def serve(args: argparse.Namespace, database_url: str | None) -> int:
    import uvicorn

    app, stoppable, backend = build(args, database_url)
    _freeze_when_restored(stoppable)
    shown = "127.0.0.1" if args.host in ("0.0.0.0", "") else args.host
    print(f"gpufold: serving {backend}", file=sys.stderr, flush=True)
    base = f"http://{shown}:{args.port}"
    print(f"gpufold: open the dashboard at {base}/  (API docs: {base}/docs)", file=sys.stderr, flush=True)
    try:
        uvicorn.run(app, host=args.host, port=args.port, log_level="info" if args.verbose else "warning")
    finally:
        for item in reversed(stoppable):
            stop = getattr(item, "stop", None) or item.close
            stop()
    return 0
