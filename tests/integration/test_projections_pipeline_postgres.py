"""The pipelined projector on the real PostgreSQL: same tables as SQLite, exactly once when two race.

No Kafka: the events come from memory through :func:`projections.runner.run`,
which pipelines on PostgreSQL (a batch applied while the one before commits).
The SIGKILL, outage and consumer-group tests in test_projections_postgres.py run
the same pipelined runner through Kafka.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, text

from projections import models
from projections.envelope import Envelope
from projections.projector import Projector
from projections.rebuild import content_hashes
from projections.runner import run
from tests.unit.projections.test_pipeline import STREAMS

pytestmark = pytest.mark.integration

SOURCE = "gpufold.events"


class MemorySource:
    """Envelopes from memory, in order, ``max_records`` at a time."""

    name = SOURCE

    def __init__(self, envelopes: list[Envelope]) -> None:
        self.left = list(envelopes)
        self.lock = threading.Lock()

    def start(self, positions: object) -> None:
        pass

    def poll(self, max_records: int, timeout: float) -> list[Envelope]:
        with self.lock:
            out, self.left = self.left[:max_records], self.left[max_records:]
        return out

    def caught_up(self) -> bool:
        return not self.left

    def lag(self) -> int:
        return len(self.left)

    def close(self) -> None:
        pass


def _envelopes(events: list) -> list[Envelope]:
    return [Envelope.of(event, offset) for offset, event in enumerate(events)]


def _reference(events: list) -> dict:
    engine = create_engine("sqlite://")
    models.Base.metadata.create_all(engine)
    Projector(engine, SOURCE).project(_envelopes(events))
    with engine.connect() as conn:
        return content_hashes(conn)


@pytest.fixture
def schema(database_url: str) -> Iterator[tuple[Engine, str]]:
    """An engine and a fresh schema holding the tables (dropped afterwards)."""
    name = f"p_{uuid.uuid4().hex[:12]}"
    engine = create_engine(database_url)
    with engine.begin() as conn:
        conn.execute(text(f'CREATE SCHEMA "{name}"'))
        models.Base.metadata.create_all(conn.execution_options(schema_translate_map={None: name}))
    yield engine, name
    with engine.begin() as conn:
        conn.execute(text(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))
    engine.dispose()


def _hashes(engine: Engine, schema: str) -> dict:
    with engine.connect() as conn:
        return content_hashes(conn.execution_options(schema_translate_map={None: schema}))


@pytest.mark.parametrize("name", sorted(STREAMS))
def test_pipelined_on_postgres_equals_one_batch_on_sqlite(schema: tuple[Engine, str], name: str) -> None:
    engine, schema_name = schema
    events = STREAMS[name]()
    projector = Projector(engine, SOURCE, schema=schema_name)
    stats = run(projector, MemorySource(_envelopes(events)), batch_size=7 if name != "workload" else 90,
                poll_timeout=0.0, stop_when_idle=True)  # fmt: skip
    assert stats.events == len(events)
    assert _hashes(engine, schema_name) == _reference(events)


def test_two_pipelined_projectors_racing_apply_each_event_once(schema: tuple[Engine, str]) -> None:
    """Two pipelined runners on the same events and tables, batch sizes that never line up: every event
    applied by exactly one of them, the tables equal to one batch's (offsets locked and checked at write)."""
    engine, schema_name = schema
    events = STREAMS["workload"]()
    stats: list = []
    errors: list[BaseException] = []

    def project(batch_size: int) -> None:
        try:
            projector = Projector(engine, SOURCE, schema=schema_name)
            stats.append(run(projector, MemorySource(_envelopes(events)), batch_size=batch_size, poll_timeout=0.0,
                             stop_when_idle=True, pipeline=True))  # fmt: skip
        except BaseException as error:  # reported below
            errors.append(error)

    racers = [threading.Thread(target=project, args=(size,)) for size in (60, 85)]
    for racer in racers:
        racer.start()
    for racer in racers:
        racer.join(300)
    assert not errors, errors
    assert sum(s.events for s in stats) == len(events)
    assert sum(s.events + s.duplicates for s in stats) == 2 * len(events)
    assert _hashes(engine, schema_name) == _reference(events)
