"""The projector against the real PostgreSQL and Kafka: crashes, outages, rebuilds, racing sealers, the HTTP API.

The events of two clusters (two partitions) are produced once to a fresh topic.
The reference is the same events projected in-process into SQLite: every
PostgreSQL projection below must equal it table by table (content hashes), so
"no missing or duplicate rows" is checked on every row of every table.
Each test projects into its own PostgreSQL schema (via the URL's search_path).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import httpx
import pytest
from sqlalchemy import Engine, create_engine, text

from projections import models
from projections.envelope import Envelope
from projections.projector import Projector
from projections.rebuild import content_hashes
from projections.secrets import mask_url
from projections.usage import HOUR_MS, seal_hour
from tests import workload

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]
POSTGRES_SH = REPO_ROOT / "scripts" / "postgres.sh"
PASSWORD_MARK = "password-must-not-leak"


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


# ------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def events() -> list:
    """Two clusters on two partitions, several hours of event time each."""
    c1 = workload.fold(workload.commands(6_000, cluster="c1", nodes=60, seed=1, step_ms=15_000), partition=0)
    c2 = workload.fold(workload.commands(6_000, cluster="c2", nodes=60, seed=2, step_ms=15_000), partition=1)
    return c1 + c2


def _create_topic(bootstrap: str) -> str:
    from confluent_kafka.admin import AdminClient, NewTopic

    name = f"t-proj-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, num_partitions=2, replication_factor=1)]).values():
        future.result(timeout=30)
    return name


def _produce(bootstrap: str, topic: str, events: list, *, chunk: int = 0, pause: float = 0.0) -> None:
    """Produce the events (in order per partition); with ``chunk``, pause between chunks to pace them."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    for i, (event, frame) in enumerate(zip(events, workload.encode(events), strict=True)):
        producer.produce(topic, frame, key=event.cluster.encode(), partition=event.partition)
        producer.poll(0)
        if chunk and i % chunk == chunk - 1:
            producer.flush(30)
            time.sleep(pause)
    assert producer.flush(30) == 0


def _reference(events: list, source: str) -> dict:
    """Per-table hashes of the events projected in-process into SQLite under ``source``."""
    engine = create_engine("sqlite://")
    models.Base.metadata.create_all(engine)
    offsets = {0: 0, 1: 0}
    batch = []
    for event in events:
        batch.append(Envelope.of(event, offsets[event.partition]))
        offsets[event.partition] += 1
    Projector(engine, source).project(batch)
    with engine.connect() as conn:
        return content_hashes(conn)


@pytest.fixture(scope="module")
def topic(kafka_bootstrap: str, events: list) -> str:
    """A fresh two-partition events topic holding all the events."""
    name = _create_topic(kafka_bootstrap)
    _produce(kafka_bootstrap, name, events)
    return name


@pytest.fixture(scope="module")
def reference(events: list, topic: str) -> dict:
    return _reference(events, topic)


@pytest.fixture
def paced_topic(kafka_bootstrap: str, events: list) -> Iterator[tuple[str, threading.Thread]]:
    """A fresh topic and a thread that produces the events into it over several seconds (start it yourself)."""
    name = _create_topic(kafka_bootstrap)
    thread = threading.Thread(
        target=_produce, args=(kafka_bootstrap, name, events), kwargs={"chunk": 100, "pause": 0.05}
    )
    yield name, thread
    if thread.is_alive():
        thread.join(60)


class _SecretUrl(str):
    """A database URL whose repr (in pytest's failure reports) hides the password."""

    __slots__ = ()

    def __repr__(self) -> str:
        return repr(mask_url(str(self)))


def _with_search_path(url: str, schema: str) -> str:
    separator = "&" if "?" in url else "?"
    return _SecretUrl(f"{url}{separator}options={quote(f'-csearch_path={schema}')}&application_name=proj-{schema}")


@pytest.fixture
def schema_url(database_url: str) -> Iterator[str]:
    """A database URL whose tables live in a fresh schema of their own (dropped afterwards)."""
    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(database_url, pool_pre_ping=True)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    yield _with_search_path(database_url, schema)
    with admin.begin() as conn:
        conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        conn.execute(text(f'DROP SCHEMA IF EXISTS "rb_{schema}" CASCADE'))
    admin.dispose()


@pytest.fixture
def engine(schema_url: str) -> Iterator[Engine]:
    eng = create_engine(schema_url, pool_pre_ping=True)
    yield eng
    eng.dispose()


def _cli(*argv: str) -> list[str]:
    return [sys.executable, "-m", "gpufold", *argv]


def _projector(
    kafka_bootstrap: str, topic: str, url: str, group: str, *extra: str, stop_when_idle: bool = True
) -> subprocess.Popen[str]:
    argv = _cli("-v", "projector", "run", "--bootstrap", kafka_bootstrap, "--topic", topic, "--group", group,
                "--database-url", url, *extra, *(["--stop-when-idle"] if stop_when_idle else []))  # fmt: skip
    env = {**os.environ, "GPUFOLD_PROJECTOR_NOTE": PASSWORD_MARK}
    return subprocess.Popen(argv, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(process: subprocess.Popen[str], timeout: float = 120) -> str:
    _out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, f"projector exit {process.returncode}:\n{err[-3000:]}"
    return err


def _applied(engine: Engine) -> int:
    with engine.connect() as conn:
        try:
            return int(conn.execute(text("SELECT coalesce(sum(next_sequence), 0) FROM projection_offsets")).scalar())
        except Exception:  # the tables are not created yet
            return 0


def _wait_for(predicate, timeout: float, what: str, process: subprocess.Popen[str] | None = None) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            detail = ""
            if process is not None:
                process.kill()
                detail = "\nprojector stderr:\n" + process.communicate(timeout=10)[1][-3000:]
            pytest.fail(f"timed out after {timeout}s waiting for {what}{detail}")
        time.sleep(0.05)


def _hashes(engine: Engine) -> dict:
    with engine.connect() as conn:
        return content_hashes(conn)


def _password(url: str) -> str:
    from sqlalchemy.engine import make_url

    return make_url(url).password or ""


# ------------------------------------------------------------------ tests


def test_sigkill_mid_batch_then_restart_loses_and_duplicates_nothing(
    kafka_bootstrap: str, paced_topic: tuple[str, threading.Thread], schema_url: str, engine: Engine, events: list
) -> None:
    """SIGKILL while a batch transaction is open, restart: the tables equal the reference exactly."""
    topic, producer = paced_topic
    producer.start()
    process = _projector(kafka_bootstrap, topic, schema_url, "crash", "--batch-size", "200", stop_when_idle=False)
    _wait_for(lambda: _applied(engine) >= len(events) // 5, 90, "a fifth of the events to be projected", process)
    application = f"proj-{schema_url.rsplit('proj-', 1)[1]}"

    def in_transaction() -> bool:
        with engine.connect() as conn:
            return bool(
                conn.execute(
                    text("SELECT count(*) FROM pg_stat_activity WHERE application_name = :app "
                         "AND xact_start IS NOT NULL AND pid <> pg_backend_pid()"),
                    {"app": application},
                ).scalar()
            )  # fmt: skip

    _wait_for(in_transaction, 60, "a batch transaction to be open", process)
    process.send_signal(signal.SIGKILL)
    process.wait(10)
    killed_at = _applied(engine)
    assert 0 < killed_at < len(events), "the projector must be killed part-way"
    producer.join(60)
    _finish(_projector(kafka_bootstrap, topic, schema_url, "crash", "--batch-size", "400"))
    assert _applied(engine) == len(events)
    assert _hashes(engine) == _reference(events, topic)


def test_postgres_restart_during_projection_is_ridden_out(
    kafka_bootstrap: str, paced_topic: tuple[str, threading.Thread], schema_url: str, engine: Engine, events: list
) -> None:
    """`scripts/postgres.sh restart` while events keep coming: the projector backs off, retries, catches up."""
    status = subprocess.run(["bash", str(POSTGRES_SH), "status"], cwd=REPO_ROOT, capture_output=True, check=False)
    if status.returncode != 0:
        message = "GPUFOLD_DATABASE_URL is not a server scripts/postgres.sh manages; it cannot be restarted"
        if _in_ci():
            pytest.fail(message)
        pytest.skip(message)
    topic, producer = paced_topic
    producer.start()
    process = _projector(kafka_bootstrap, topic, schema_url, "outage", "--batch-size", "200", stop_when_idle=False)
    _wait_for(lambda: _applied(engine) > 0, 90, "the projection to start", process)
    restart = subprocess.run(["bash", str(POSTGRES_SH), "restart"], cwd=REPO_ROOT, capture_output=True, text=True,
                             timeout=180, check=False)  # fmt: skip
    assert restart.returncode == 0, restart.stderr
    producer.join(60)
    _wait_for(lambda: _applied(engine) == len(events), 120, "the projector to catch up", process)
    process.send_signal(signal.SIGTERM)
    err = _finish(process, timeout=60)
    assert "database unavailable" in err, "the projector should have seen the outage and retried"
    assert _password(schema_url) not in err
    assert _hashes(engine) == _reference(events, topic)


def test_rebuild_equals_live(kafka_bootstrap: str, topic: str, schema_url: str, engine: Engine) -> None:
    """`gpufold projections rebuild` re-projects from offset 0 into a fresh schema and finds it equal."""
    _finish(_projector(kafka_bootstrap, topic, schema_url, "live"))
    schema = "rb_" + schema_url.split("search_path%3D", 1)[1].split("&", 1)[0]
    result = subprocess.run(
        _cli("projections", "rebuild", "--bootstrap", kafka_bootstrap, "--topic", topic, "--database-url", schema_url,
             "--schema", schema),
        cwd=REPO_ROOT, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert '"equal": true' in result.stdout
    assert _password(schema_url) not in result.stdout + result.stderr


def test_two_projectors_racing_seal_each_hour_once(
    kafka_bootstrap: str, topic: str, schema_url: str, engine: Engine, reference: dict
) -> None:
    """Two projectors on the same events and database: every event applied once, every hour sealed once."""
    subprocess.run(_cli("projections", "migrate", "--database-url", schema_url), cwd=REPO_ROOT, check=True,
                   capture_output=True)  # fmt: skip
    first = _projector(kafka_bootstrap, topic, schema_url, "race-a", "--batch-size", "250")
    second = _projector(kafka_bootstrap, topic, schema_url, "race-b", "--batch-size", "350")
    _finish(first)
    _finish(second)
    assert _hashes(engine) == reference  # includes usage_hours.sealed_watermark and tenant_usage


def test_concurrent_seals_of_one_hour_seal_it_once(engine: Engine) -> None:
    """Two transactions sealing the same hour: the second waits for the first, then finds it sealed."""
    models.Base.metadata.create_all(engine)
    hour = workload.START_MS
    with engine.begin() as conn:
        conn.execute(models.usage_hours.insert(), {"cluster": "c1", "hour": hour, "status": "open"})
    results: list[bool] = []
    with engine.connect() as first:
        first.begin()
        results.append(seal_hour(first, "c1", hour, hour + HOUR_MS))

        def second() -> None:
            with engine.begin() as conn:
                results.append(seal_hour(conn, "c1", hour, hour + 2 * HOUR_MS))

        racer = threading.Thread(target=second)
        racer.start()
        time.sleep(0.3)
        assert racer.is_alive(), "the second sealer must wait for the first one's row lock"
        first.commit()
        racer.join(10)
    assert results == [True, False]
    with engine.connect() as conn:
        row = conn.execute(models.usage_hours.select()).one()
    assert (row.status, row.sealed_watermark) == ("sealed", hour + HOUR_MS)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_http_api_refuses_hostile_parameters_and_changes_nothing(
    kafka_bootstrap: str, topic: str, schema_url: str, engine: Engine
) -> None:
    """Over real HTTP (uvicorn): answers, 4xx with messages for hostile input, tables unchanged, /metrics."""
    import uvicorn

    from projections.api import create_app

    _finish(_projector(kafka_bootstrap, topic, schema_url, "api"))
    before = _hashes(engine)
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(create_app(schema_url), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    try:
        _wait_for(lambda: server.started, 20, "uvicorn to start")
        base = f"http://127.0.0.1:{port}"
        with httpx.Client(base_url=base, timeout=10) as client:
            ok = client.get("/v1/utilization", params={"by": "model", "cluster": "c1"})
            assert ok.status_code == 200 and {row["gpu_model"] for row in ok.json()} == set(workload.MODELS)
            assert client.get("/v1/pending", params={"cluster": "c2", "limit": 5}).status_code == 200
            assert client.get("/v1/commands/c1-cmd-1").json()["outcome"] == "accepted"
            hostile = [
                ("/v1/pending", {"cluster": "c1'; DROP TABLE pods; --"}),
                ("/v1/pending", {"cluster": "c1", "limit": "1" + "0" * 30}),
                ("/v1/pending", {"cluster": "c1", "offset": "-5"}),
                ("/v1/usage", {"start": "0", "end": "1 OR 1=1"}),
                ("/v1/usage", {"start": "[]", "end": "{}"}),
                ("/v1/usage/top", {"start": "0", "end": "10", "limit": "true"}),
                ("/v1/utilization", {"by": "node', 'x"}),
                ("/v1/clusters/c1/pods/%00/history", {}),
                ("/v1/fragmentation", {"cluster": "c1\u0000"}),
            ]
            for path, params in hostile:
                response = client.get(path, params=params)
                assert 400 <= response.status_code < 500, (path, params, response.status_code)
                assert response.json()["detail"], (path, params)
            metrics = client.get("/metrics").text
            assert "gpufold_gpus_allocated" in metrics and "gpufold_api_requests_total" in metrics
    finally:
        server.should_exit = True
        thread.join(10)
    assert _hashes(engine) == before


def test_the_migrations_build_exactly_the_models_tables(engine: Engine) -> None:
    """Alembic's migrations (0001 through the latest) and the SQLAlchemy models agree column for column:
    a database migrated in production has every table and index the projector writes."""
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    from projections import models
    from projections.schema import migrate

    migrate(engine)
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        differences = [d for d in compare_metadata(context, models.Base.metadata) if d[0] != "remove_table"]
    assert differences == []
