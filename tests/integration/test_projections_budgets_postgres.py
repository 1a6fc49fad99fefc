"""Disruption budgets and retries on the real PostgreSQL, in tables the migrations built (issue #25).

The budget stream of tests/unit/projections/test_handlers_budgets.py (budgets set, replaced and removed; a
drain blocked, cancelled by an uncordon and let through) is projected one command at a time into a schema
that Alembic migrated; after each command the budgets and the evictions each blocks must be what the same
events give on SQLite, and the HTTP API must answer them. The gang and pod retries of
tests/unit/projections/test_handlers_gangs.py go through the pipelined runner and must give SQLite's tables.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from urllib.parse import quote

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, create_engine, text

from projections import models, queries
from projections.api import create_app
from projections.envelope import Envelope
from projections.projector import Projector
from projections.rebuild import content_hashes
from projections.runner import run
from projections.schema import migrate
from tests.integration.test_projections_pipeline_postgres import MemorySource
from tests.unit.projections.test_handlers_budgets import events_by_step
from tests.unit.projections.test_handlers_gangs import retry_stream

pytestmark = pytest.mark.integration

SOURCE = "gpufold.events"


@pytest.fixture
def engine(database_url: str) -> Iterator[Engine]:
    """An engine on a fresh schema of its own (search_path), migrated by Alembic; dropped afterwards."""
    schema = f"b_{uuid.uuid4().hex[:12]}"
    admin = create_engine(database_url)
    with admin.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
    separator = "&" if "?" in database_url else "?"
    eng = create_engine(f"{database_url}{separator}options={quote(f'-csearch_path={schema}')}", pool_pre_ping=True)
    migrate(eng)
    yield eng
    eng.dispose()
    with admin.begin() as conn:
        conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
    admin.dispose()


def test_budgets_and_their_blocked_evictions_match_sqlite_after_every_command(engine: Engine) -> None:
    reference = create_engine("sqlite://")
    models.Base.metadata.create_all(reference)
    on_postgres, on_sqlite = Projector(engine, SOURCE), Projector(reference, SOURCE)
    offset = 0
    seen: list[dict[str, list[str]]] = []
    for _name, events in events_by_step():
        envelopes = [Envelope.of(event, offset + i) for i, event in enumerate(events)]
        offset += len(events)
        on_postgres.project(envelopes)
        on_sqlite.project(envelopes)
        with engine.connect() as pg, reference.connect() as lite:
            answer = queries.disruption_budgets(pg, cluster="lab")
            assert answer == queries.disruption_budgets(lite, cluster="lab")
        seen.append({b["budget_id"]: [e["pod_id"] for e in b["blocked_evictions"]] for b in answer["budgets"]})
    # The drain blocked by b-t, cancelled, blocked again, let through one pod, then b-t removed.
    assert {"b-t": ["p1", "p2"], "b-zone": []} in seen
    assert seen[-3:] == [{"b-t": ["p1", "p2"], "b-zone": []}, {"b-t": ["p2"], "b-zone": []}, {"b-zone": []}]
    with engine.connect() as pg, reference.connect() as lite:
        assert content_hashes(pg) == content_hashes(lite)
    client = TestClient(create_app(engine))
    response = client.get("/v1/disruption-budgets", params={"cluster": "lab"})
    assert response.status_code == 200
    assert [b["budget_id"] for b in response.json()["budgets"]] == ["b-zone"]
    assert client.get("/v1/disruption-budgets", params={"cluster": "nowhere"}).status_code == 404


def test_gang_and_pod_retries_pipelined_give_sqlites_tables(engine: Engine) -> None:
    events = retry_stream()
    envelopes = [Envelope.of(event, offset) for offset, event in enumerate(events)]
    stats = run(Projector(engine, SOURCE), MemorySource(envelopes), batch_size=1, poll_timeout=0.0,
                stop_when_idle=True, pipeline=True)  # fmt: skip
    assert stats.events == len(events)
    reference = create_engine("sqlite://")
    models.Base.metadata.create_all(reference)
    Projector(reference, SOURCE).project(envelopes)
    with engine.connect() as pg, reference.connect() as lite:
        assert content_hashes(pg) == content_hashes(lite)
        gangs = queries.gangs(pg, cluster="lab")["gangs"]
    assert [g["status"] for g in gangs if g["gang_id"] == "r"] == ["running"]
