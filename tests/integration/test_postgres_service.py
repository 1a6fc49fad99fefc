"""The throwaway PostgreSQL from `scripts/postgres.sh` works as the projector needs.

Transactions behave (rollback discards, commit keeps), and `scripts/postgres.sh
restart` brings the same server back on the same address with committed data
intact: other tests restart PostgreSQL mid-projection to prove the projector
retries, and rely on this.
"""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, Engine, create_engine, inspect, text
from sqlalchemy.exc import OperationalError

REPO_ROOT = Path(__file__).resolve().parents[2]
POSTGRES_SH = REPO_ROOT / "scripts" / "postgres.sh"


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in {"1", "true", "yes"}


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    eng = create_engine(database_url, pool_pre_ping=True)
    try:
        yield eng
    finally:
        eng.dispose()


@pytest.fixture
def table(engine: Engine) -> Iterator[str]:
    """A table name unique to this test, dropped afterwards."""
    name = f"test_pg_service_{uuid.uuid4().hex[:12]}"
    yield name
    with engine.begin() as conn:
        conn.execute(text(f"DROP TABLE IF EXISTS {name}"))


def _sql(conn: Connection, statement: str) -> Any:
    return conn.execute(text(statement))


def _create(conn: Connection, table: str) -> None:
    _sql(conn, f"CREATE TABLE {table} (id integer PRIMARY KEY, body text NOT NULL)")


def test_rollback_discards_and_commit_keeps(engine: Engine, table: str) -> None:
    with engine.connect() as conn:
        who = _sql(conn, "SELECT current_user, current_database()").one()
    assert tuple(who) == ("gpufold", "gpufold")

    # DDL and rows in a transaction that rolls back leave no trace.
    with engine.connect() as conn:
        trans = conn.begin()
        _create(conn, table)
        _sql(conn, f"INSERT INTO {table} VALUES (1, 'rolled back')")
        assert _sql(conn, f"SELECT count(*) FROM {table}").scalar_one() == 1
        trans.rollback()
    assert not inspect(engine).has_table(table)

    # The same work committed is kept, and seen from another connection.
    with engine.begin() as conn:
        _create(conn, table)
        _sql(conn, f"INSERT INTO {table} VALUES (1, 'committed'), (2, 'kept')")
    assert inspect(engine).has_table(table)

    # A rolled-back insert into the committed table is discarded.
    with engine.connect() as conn, conn.begin() as trans:
        _sql(conn, f"INSERT INTO {table} VALUES (3, 'rolled back')")
        trans.rollback()
    with engine.connect() as conn:
        rows = _sql(conn, f"SELECT id, body FROM {table} ORDER BY id").all()
    assert [tuple(r) for r in rows] == [(1, "committed"), (2, "kept")]


def _postgres_sh(command: str) -> subprocess.CompletedProcess[str]:
    # The script keeps its state in ${GPUFOLD_RUN_DIR:-$PWD/.services}: run it
    # from the repo root, as make and CI do, with any inherited GPUFOLD_RUN_DIR.
    return subprocess.run(
        ["bash", str(POSTGRES_SH), command],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def _start_time(conn: Connection) -> Any:
    return _sql(conn, "SELECT pg_postmaster_start_time()").scalar_one()


def test_restart_keeps_data(engine: Engine, database_url: str, table: str) -> None:
    status = _postgres_sh("status")
    if status.returncode != 0:
        message = (
            "the PostgreSQL at GPUFOLD_DATABASE_URL is not one that "
            "scripts/postgres.sh manages, so it cannot be restarted "
            f"(status exit {status.returncode}: {status.stderr.strip()})"
        )
        if _in_ci():
            pytest.fail(message)
        pytest.skip(message)

    with engine.begin() as conn:
        _create(conn, table)
        _sql(conn, f"INSERT INTO {table} SELECT g, 'r' FROM generate_series(1, 1000) g")
    with engine.connect() as conn:
        started_before = _start_time(conn)

    # Hold a connection open across the restart: the server must drop it.
    held = engine.connect()
    try:
        _sql(held, "SELECT 1")
        restart = _postgres_sh("restart")
        assert restart.returncode == 0, f"restart failed:\n{restart.stderr}"
        with pytest.raises(OperationalError):
            _sql(held, "SELECT 1")
    finally:
        held.close()

    # A brand-new engine on the same URL (same port, same password) connects.
    fresh = create_engine(database_url)
    try:
        with fresh.connect() as conn:
            started_after = _start_time(conn)
            count, total = _sql(conn, f"SELECT count(*), sum(id) FROM {table}").one()
        assert started_after > started_before, "the server was not restarted"
        assert (count, total) == (1000, 500500)
        # And it takes writes again.
        with fresh.begin() as conn:
            _sql(conn, f"INSERT INTO {table} VALUES (1001, 'after restart')")
        with fresh.connect() as conn:
            body = _sql(conn, f"SELECT body FROM {table} WHERE id = 1001").scalar_one()
        assert body == "after restart"
    finally:
        fresh.dispose()

    # The old engine's pool recovers too (pool_pre_ping drops dead connections).
    with engine.connect() as conn:
        assert _sql(conn, f"SELECT count(*) FROM {table}").scalar_one() == 1001
