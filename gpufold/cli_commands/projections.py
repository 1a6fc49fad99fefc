"""``gpufold projector run``, ``gpufold query``, ``gpufold serve``, ``gpufold projections migrate|rebuild``.

The database comes from ``--database-url`` or ``GPUFOLD_DATABASE_URL``; its
password never appears in output, logs or errors (see ``projections.secrets``).

Nothing here creates a database by mistake: ``query``, ``serve`` and ``projections rebuild``
need an existing SQLite file that holds the projection tables, ``projector run`` makes a
new SQLite file only with ``--create``, and only ``projections migrate`` creates by design.
(A PostgreSQL database is never created here; its tables are, by migrate and the projector.)
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import io
import json
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from datetime import datetime
from typing import Any

from gpufold.cli import CliError
from gpufold.cli_commands.options import add_cluster_option
from gpufold.text import printable

log = logging.getLogger("gpufold.projector")


# ------------------------------------------------------------------ shared options


def _add_database(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--database-url",
        default=None,
        help="SQLAlchemy URL, e.g. postgresql+psycopg://user:pass@host/db or sqlite:///file "
        "(default: $GPUFOLD_DATABASE_URL)",
    )


def _database_url(args: argparse.Namespace) -> str:
    url = args.database_url or os.environ.get("GPUFOLD_DATABASE_URL", "")
    if not url:
        raise CliError("no database: pass --database-url or set GPUFOLD_DATABASE_URL")
    return str(url)


def _sqlite_file(url: str) -> str | None:
    """The file a SQLite URL names (None for other databases and in-memory ones)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return None
    database = parsed.database or ""
    if not parsed.drivername.startswith("sqlite") or database in ("", ":memory:") or database.startswith("file:"):
        return None
    return database


def _engine(url: str, *, existing: bool = False, create_hint: str = "") -> Any:
    """An engine; with ``existing`` a SQLite file must already be there and hold the projection tables."""
    from sqlalchemy import create_engine
    from sqlalchemy.exc import ArgumentError

    from projections.secrets import safe_url

    path = _sqlite_file(url)
    if existing and path is not None:
        from pathlib import Path

        if not Path(path).is_file():
            raise CliError(f"no database at {printable(path)}{create_hint}")
    try:
        engine = create_engine(url, pool_pre_ping=True)
    except (ArgumentError, ValueError) as error:
        raise CliError(f"invalid database URL {safe_url(url)}: {type(error).__name__}") from None
    except ImportError as error:
        raise CliError(f"database driver missing for {safe_url(url)}: {error.name}") from None
    if existing and path is not None:
        from sqlalchemy.exc import SQLAlchemyError

        from projections.schema import has_tables

        try:
            ready = has_tables(engine)
        except SQLAlchemyError as error:
            raise CliError(
                f"{printable(path)} is not a projection database: {str(getattr(error, 'orig', None) or error)[:200]}"
            ) from None
        if not ready:
            engine.dispose()
            raise CliError(
                f"{printable(path)} holds no projection tables (project into it first: gpufold projector run)"
            )
    return engine


def _new_engine(url: str) -> Any:
    from sqlalchemy import create_engine
    from sqlalchemy.exc import ArgumentError

    from projections.secrets import safe_url

    try:
        return create_engine(url, pool_pre_ping=True)
    except (ArgumentError, ValueError) as error:
        raise CliError(f"invalid database URL {safe_url(url)}: {type(error).__name__}") from None
    except ImportError as error:
        raise CliError(f"database driver missing for {safe_url(url)}: {error.name}") from None


def _guard(action: Callable[[], int]) -> int:
    """Run an action, turning database errors into one masked line."""
    from sqlalchemy.exc import SQLAlchemyError

    from projections.envelope import ProjectionError
    from projections.secrets import mask_url

    try:
        return action()
    except SQLAlchemyError as error:
        detail = str(getattr(error, "orig", None) or error).strip().splitlines()[0]
        raise CliError(f"database error: {mask_url(detail)}") from None
    except ProjectionError as error:
        print(f"gpufold: projection stopped, nothing of the failing batch was written: {mask_url(str(error))}",
              file=sys.stderr)  # fmt: skip
        return 1


def _time(value: str) -> int:
    """Epoch milliseconds, or an ISO 8601 time (UTC unless it says otherwise)."""
    if value.lstrip("-").isdigit():
        return int(value)
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"not epoch milliseconds or an ISO 8601 time: {value!r}") from None
    if moment.tzinfo is None:
        from datetime import UTC

        moment = moment.replace(tzinfo=UTC)
    return int(moment.timestamp() * 1000)


def _print(value: Any) -> None:
    json.dump(value, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


# ------------------------------------------------------------------ projector run


def _source(args: argparse.Namespace, until: dict[int, int] | None = None) -> Any:
    from logs.embedded import LogError
    from projections.sources import EmbeddedEventSource, KafkaEventSource

    if args.embedded_log:
        try:
            return EmbeddedEventSource(args.embedded_log, args.topic, until=until)
        except LogError as error:
            raise CliError(str(error)) from None
    bootstrap = args.bootstrap or os.environ.get("GPUFOLD_KAFKA_BOOTSTRAP", "")
    if not bootstrap:
        raise CliError("no event source: pass --bootstrap (or set GPUFOLD_KAFKA_BOOTSTRAP) or --embedded-log")
    extra: dict[str, Any] = {}
    try:  # security settings etc. from the Kafka adapter's config module, when present
        from gpufold import kafka_config  # type: ignore[attr-defined]

        extra = dict(getattr(kafka_config, "client_overrides", lambda: {})())
    except Exception:
        extra = {}
    return KafkaEventSource(bootstrap, args.topic, group=args.group, until=until, extra_config=extra)


def _add_source(parser: argparse.ArgumentParser) -> None:
    from projections.defaults import DEFAULT_GROUP, DEFAULT_TOPIC

    parser.add_argument("--bootstrap", default=None, help="Kafka bootstrap servers (default: $GPUFOLD_KAFKA_BOOTSTRAP)")
    parser.add_argument("--embedded-log", default=None, metavar="PATH", help="read the events of an embedded log file")
    parser.add_argument("--topic", default=DEFAULT_TOPIC, help=f"events topic (default: {DEFAULT_TOPIC})")
    parser.add_argument("--group", default=DEFAULT_GROUP, help=f"Kafka consumer group (default: {DEFAULT_GROUP})")
    parser.add_argument(
        "--lateness-seconds",
        type=int,
        default=300,
        help="usage hours are sealed once the event-time watermark passes their end plus this "
        "(default: 300, at most 604800: 7 days)",
    )
    parser.add_argument("--batch-size", type=int, default=5_000, help="events per transaction (default: 5000)")


def _projector_run(args: argparse.Namespace) -> int:
    from projections.projector import Projector
    from projections.runner import run
    from projections.schema import ensure_schema
    from projections.secrets import safe_url
    from projections.usage import MAX_LATENESS_MS

    url = _database_url(args)
    if args.batch_size < 1 or not 0 <= args.lateness_seconds * 1000 <= MAX_LATENESS_MS:
        raise CliError(f"--batch-size must be >= 1 and --lateness-seconds between 0 and {MAX_LATENESS_MS // 1000}")
    path = _sqlite_file(url)
    if path is not None and not args.create:
        from pathlib import Path

        if not Path(path).is_file():
            raise CliError(f"no database at {printable(path)}: pass --create to start a new projection database")
    engine = _new_engine(url)
    if args.metrics_port:
        from prometheus_client import start_http_server

        start_http_server(args.metrics_port, addr=args.metrics_host)
    stop = threading.Event()

    def on_signal(signum: int, frame: Any) -> None:
        log.info("signal %d: stopping after the current batch", signum)
        stop.set()

    previous = {signum: signal.signal(signum, on_signal) for signum in (signal.SIGTERM, signal.SIGINT)}
    # `kill -USR1 PID` prints every thread's stack (not possible when stderr is no real file, as in tests).
    with contextlib.suppress(AttributeError, ValueError, io.UnsupportedOperation):
        faulthandler.register(signal.SIGUSR1, all_threads=True)

    def action() -> int:
        source = _source(args)  # a missing source is an error before any table is created
        try:
            if not args.no_migrate:
                ensure_schema(engine)
            projector = Projector(engine, source.name, lateness_ms=args.lateness_seconds * 1000)
            log.info("projecting %s into %s", source.name, safe_url(url))
            stats = run(projector, source, batch_size=args.batch_size, stop_when_idle=args.stop_when_idle, stop=stop)
        finally:
            source.close()
        _print({"events": stats.events, "duplicates": stats.duplicates, "undecodable": stats.undecodable,
                "batches": stats.batches, "seconds": round(stats.seconds, 3),
                "events_per_second": round(stats.events / stats.seconds, 1) if stats.seconds else 0.0})  # fmt: skip
        return 0

    try:
        return _guard(action)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
        engine.dispose()


# ------------------------------------------------------------------ query


def _query(args: argparse.Namespace) -> int:
    from projections import queries

    engine = _engine(_database_url(args), existing=True, create_hint=" (query never creates one)")
    params = {k: v for k, v in vars(args).items() if k in _QUERY_PARAMS.get(args.query_name, ()) and v is not None}
    function = getattr(queries, _QUERY_FUNCTIONS[args.query_name])

    def action() -> int:
        with engine.connect() as conn:
            try:
                _print(function(conn, **params))
            except queries.QueryError as error:
                raise CliError(str(error)) from None
            except queries.NotFound as error:
                print(f"gpufold: {error.args[0]}", file=sys.stderr)
                return 1
        return 0

    try:
        return _guard(action)
    finally:
        engine.dispose()


_QUERY_FUNCTIONS = {
    "utilization": "utilization_now",
    "utilization-history": "utilization_history",
    "fragmentation": "fragmentation_now",
    "pending": "pending",
    "gangs": "gangs",
    "reservations": "reservations",
    "disruption-budgets": "disruption_budgets",
    "disruptions": "disruptions",
    "pod": "pod_history",
    "command": "command_outcome",
    "usage": "tenant_usage",
    "top": "top_consumers",
    "status": "status",
}
_QUERY_PARAMS = {
    "utilization": ("by", "cluster", "limit", "offset"),
    "utilization-history": ("cluster", "start", "end", "step_ms", "gpu_model"),
    "fragmentation": ("cluster",),
    "pending": ("cluster", "limit", "offset"),
    "gangs": ("cluster", "state", "limit", "offset"),
    "reservations": ("cluster",),
    "disruption-budgets": ("cluster",),
    "disruptions": ("cluster", "pod_id", "limit", "offset"),
    "pod": ("cluster", "pod_id"),
    "command": ("command_id",),
    "usage": ("start", "end", "granularity", "tenant", "cluster"),
    "top": ("start", "end", "limit", "cluster"),
    "status": (),
}


def _register_query(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "query",
        help="ask the projection a question (JSON out)",
        description="Ask the projection database a question; the answer is JSON on standard output. Times are "
        "epoch milliseconds or ISO 8601 (UTC unless a zone is given). The database must exist and hold the "
        "projection tables: a query never creates one.",
    )
    names = parser.add_subparsers(dest="query_name", metavar="NAME", required=True)

    def add(name: str, help_: str) -> argparse.ArgumentParser:
        sub = names.add_parser(name, help=help_, description=help_[0].upper() + help_[1:] + ".")
        _add_database(sub)
        sub.set_defaults(handler=_query)
        return sub

    sub = add("utilization", "GPUs allocated vs capacity now, by cluster, GPU model or node")
    start_help, end_help = (
        "start of the range (inclusive): epoch ms or ISO 8601",
        "end (exclusive): epoch ms or ISO 8601",
    )
    sub.add_argument("--by", choices=("cluster", "model", "node"), default="cluster", help="group by (default cluster)")
    add_cluster_option(sub)
    sub.add_argument("--limit", type=int, help="at most this many rows (1-1000, default 100)")
    sub.add_argument("--offset", type=int, help="skip this many rows first (default 0)")
    sub = add("utilization-history", "allocated vs capacity over time")
    add_cluster_option(sub, required=True)
    sub.add_argument("--start", type=_time, required=True, help=start_help)
    sub.add_argument("--end", type=_time, required=True, help=end_help)
    sub.add_argument("--step-ms", dest="step_ms", type=int, default=3_600_000, help="step in ms (default 1 hour)")
    sub.add_argument("--gpu-model", dest="gpu_model", help="only this GPU model")
    sub = add("fragmentation", "FGD fragmentation of the cluster now")
    add_cluster_option(sub, required=True)
    sub = add("pending", "pending pods in queue order, with reasons; pending gangs and the reservation")
    add_cluster_option(sub, required=True)
    sub.add_argument("--limit", type=int, help="at most this many pods (1-1000, default 100)")
    sub.add_argument("--offset", type=int, help="skip this many pods first (default 0)")
    sub = add("gangs", "gangs with their members and state, in queue order")
    add_cluster_option(sub, required=True)
    sub.add_argument("--state", choices=("waiting", "pending", "running", "released"), help="only this state")
    sub.add_argument("--limit", type=int, help="at most this many gangs (1-1000, default 100)")
    sub.add_argument("--offset", type=int, help="skip this many gangs first (default 0)")
    sub = add("reservations", "current reservations: the nodes held for the head of each queue")
    add_cluster_option(sub)
    sub = add("disruption-budgets", "disruption budgets set now, each with the drain evictions it blocks")
    add_cluster_option(sub)
    sub = add("disruptions", "preemptions and migrations of a cluster, newest first, each with its cause")
    add_cluster_option(sub, required=True)
    sub.add_argument("--pod", dest="pod_id", help="only this pod")
    sub.add_argument("--limit", type=int, help="at most this many events (1-1000, default 100)")
    sub.add_argument("--offset", type=int, help="skip this many events first (default 0)")
    sub = add("pod", "a pod's full history: every event with its causing command")
    add_cluster_option(sub, required=True, help="the pod's cluster")
    sub.add_argument("--pod", dest="pod_id", required=True, help="the pod id")
    sub = add("command", "a command's outcome by command id")
    sub.add_argument("--command-id", dest="command_id", required=True, help="the command id")
    sub = add("usage", "GPU-hours per tenant by hour or day of event time")
    sub.add_argument("--start", type=_time, required=True, help=start_help)
    sub.add_argument("--end", type=_time, required=True, help=end_help)
    sub.add_argument("--granularity", choices=("hour", "day"), default="hour", help="period (default hour)")
    sub.add_argument("--tenant", help="only this tenant")
    add_cluster_option(sub)
    sub = add("top", "top consumers (tenants by GPU-hours)")
    sub.add_argument("--start", type=_time, required=True, help=start_help)
    sub.add_argument("--end", type=_time, required=True, help=end_help)
    sub.add_argument("--limit", type=int, help="at most this many tenants (1-1000, default 10)")
    add_cluster_option(sub)
    add("status", "projection offsets and usage watermarks")


# ------------------------------------------------------------------ serve


def _serve(args: argparse.Namespace) -> int:
    from gpufold.server.cli import serve

    url = args.database_url or os.environ.get("GPUFOLD_DATABASE_URL") or None
    if url is not None:  # an existing projection database only: serve never creates one
        _engine(url, existing=True, create_hint=" (serve never creates one)").dispose()
    return serve(args, url)


# ------------------------------------------------------------------ projections migrate | rebuild


def _migrate(args: argparse.Namespace) -> int:
    from projections.schema import ensure_schema

    engine = _new_engine(_database_url(args))  # migrate creates the tables (and a SQLite file) by design

    def action() -> int:
        ensure_schema(engine)
        print("projection schema is up to date", file=sys.stderr)
        return 0

    try:
        return _guard(action)
    finally:
        engine.dispose()


def _rebuild(args: argparse.Namespace) -> int:
    from projections.rebuild import rebuild

    engine = _engine(_database_url(args), existing=True, create_hint=" (rebuild compares with a live projection)")

    def action() -> int:
        source_name = args.topic
        report = rebuild(
            engine,
            source_name,
            lambda until: _source(args, until),
            schema=args.schema,
            keep=args.keep,
            lateness_ms=args.lateness_seconds * 1000,
            batch_size=args.batch_size,
        )
        _print(report.as_json())
        if not report.equal:
            print("gpufold: the rebuilt projection differs from the live one", file=sys.stderr)
            return 1
        return 0

    try:
        return _guard(action)
    finally:
        engine.dispose()


# ------------------------------------------------------------------ registration


def register(subparsers: Any) -> None:
    projector = subparsers.add_parser(
        "projector",
        help="project the events topic into PostgreSQL (or SQLite)",
        description="The projector: folds the processor's events into the read-side tables.",
    )
    actions = projector.add_subparsers(dest="projector_action", metavar="ACTION", required=True)
    run_parser = actions.add_parser(
        "run",
        help="consume events and project them, exactly once per event",
        description="Consume the events topic (Kafka with --bootstrap, or an embedded log file with --embedded-log) "
        "and project each batch into the database in one transaction with its source offsets, so a crash or a "
        "restart never loses or repeats an event. Usage hours are sealed as event time passes (a gap in event "
        "time costs a few rows, never one per hour). SIGTERM or Ctrl-C stop it after the current batch. The "
        "tables are created or upgraded at start (--no-migrate: not); a new SQLite file needs --create.",
    )
    _add_database(run_parser)
    _add_source(run_parser)
    run_parser.add_argument("--stop-when-idle", action="store_true", help="exit once every partition is read")
    run_parser.add_argument("--no-migrate", action="store_true", help="do not create/upgrade the tables at start")
    run_parser.add_argument("--create", action="store_true", help="create the SQLite database file if it is missing")
    run_parser.add_argument("--metrics-port", type=int, default=0, help="serve Prometheus /metrics on this port")
    run_parser.add_argument("--metrics-host", default="127.0.0.1", help="address for /metrics (default 127.0.0.1)")
    run_parser.set_defaults(handler=_projector_run)

    _register_query(subparsers)

    from gpufold.server.cli import add_serve_arguments

    serve = subparsers.add_parser(
        "serve",
        help="the HTTP API and dashboard: live replica, writes, what-if, projections (OpenAPI at /docs), /metrics",
        description="Serve the dashboard at / and the API (OpenAPI at /docs): the live replica of the fold "
        "(--log PATH, the default, or --bootstrap HOST:PORT), the write API, and the projections' queries when a "
        "database is given (--database-url or $GPUFOLD_DATABASE_URL). See gpufold/server/cli.py.",
    )
    _add_database(serve)
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000)")
    add_serve_arguments(serve)
    serve.set_defaults(handler=_serve)

    proj = subparsers.add_parser(
        "projections",
        help="manage the projection tables",
        description="Manage the projection tables: create or upgrade them, or rebuild and compare.",
    )
    proj_actions = proj.add_subparsers(dest="projections_action", metavar="ACTION", required=True)
    migrate = proj_actions.add_parser(
        "migrate",
        help="create or upgrade the tables (Alembic)",
        description="Create or upgrade the projection tables (Alembic on PostgreSQL); creates a SQLite file by design.",
    )
    _add_database(migrate)
    migrate.set_defaults(handler=_migrate)
    rebuild_parser = proj_actions.add_parser(
        "rebuild",
        help="re-project from offset 0 into a fresh schema and prove it equals the live one",
        description="Re-project every event from offset 0 into a fresh schema and compare it, table by table, "
        "with the live projection (exit status 1 on a difference).",
    )
    _add_database(rebuild_parser)
    _add_source(rebuild_parser)
    rebuild_parser.add_argument("--schema", default="gpufold_rebuild", help="the fresh PostgreSQL schema's name")
    rebuild_parser.add_argument("--keep", action="store_true", help="keep the rebuilt schema for inspection")
    rebuild_parser.set_defaults(handler=_rebuild)
