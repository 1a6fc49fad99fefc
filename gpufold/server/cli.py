"""``gpufold serve``'s options and start-up: which log the replica follows and the writes go to.

- ``--bootstrap`` (or ``GPUFOLD_KAFKA_BOOTSTRAP`` when no ``--log`` is given): Kafka. The replica reads the commands and
  snapshots topics; writes go through ``CommandPublisher``; the processor runs elsewhere.
- ``--log`` (or ``GPUFOLD_LOG``), or nothing at all: the embedded log (a missing one only with ``--create``). The
  server also runs the processor on it in a thread (``--no-processor`` to leave that to
  ``gpufold run``), so submitting, waiting and watching work on one machine with no servers.
- ``--database-url`` alone (the old form): the projections' read API only, plus the dashboard page.

``GPUFOLD_API_TOKEN``, when set, is the bearer token every write needs.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from gpufold.cli import CliError

TOKEN_ENV = "GPUFOLD_API_TOKEN"


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    from gpufold.cli_commands._embedded import LOG_HELP

    group = parser.add_argument_group("the live replica and the write API")
    group.add_argument("--log", metavar="PATH", default=None, help=LOG_HELP)
    group.add_argument(
        "--bootstrap", metavar="HOST:PORT", default=None, help="Kafka (default: $GPUFOLD_KAFKA_BOOTSTRAP)"
    )
    group.add_argument("--kafka-config", metavar="FILE", default=None, help="librdkafka properties file")
    group.add_argument("--topic-prefix", default="gpufold", help="Kafka topic prefix (default: %(default)s)")
    group.add_argument(
        "--no-processor", action="store_true", help="embedded log: do not fold in this process (gpufold run does)"
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


def build(args: argparse.Namespace, database_url: str | None) -> tuple[Any, list[Any], str]:
    """(app, things to stop, a description of the backend) for the parsed ``serve`` arguments."""
    from gpufold.server.app import create_app
    from processor.runtime.replica import Replica

    # Flags before the environment: --log wins over $GPUFOLD_KAFKA_BOOTSTRAP, --bootstrap over $GPUFOLD_LOG.
    bootstrap = args.bootstrap or (None if args.log else os.environ.get("GPUFOLD_KAFKA_BOOTSTRAP"))
    embedded_path = args.log or os.environ.get("GPUFOLD_LOG")
    token = os.environ.get(TOKEN_ENV) or None
    stoppable: list[Any] = []
    writer: Any = None
    replica: Replica | None = None
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
        if args.tick_interval < 0:
            raise CliError("--tick-interval must be >= 0 seconds")
        if not args.no_processor:
            stoppable.append(EmbeddedProcessor(path, tick_interval=args.tick_interval).start())
        backend = f"embedded log {path}" + ("" if args.no_processor else " (processor running in this process)")
    else:
        backend = "projections only (no --log or --bootstrap: no replica, no writes)"
    if replica is not None:
        stoppable.append(replica)
    if writer is not None:
        stoppable.append(writer)
    app = create_app(database=database_url, replica=replica, writer=writer, token=token)
    if token:
        backend += "; writes need the bearer token"
    return app, stoppable, backend


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
