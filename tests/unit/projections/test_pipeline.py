"""The pipelined projector (a batch applied while the one before it commits) on SQLite files.

Each stream is projected through :class:`projections.pipeline.Pipeline` in small
batches and must give exactly the tables of one unpipelined batch: every row a
batch takes over from the batch before it (nodes removed and added again, pods,
gangs, reservations, disruption budgets, totals, usage rates and clocks) must be what that batch
left. When the offsets move under it (another projector of the group), a
pipelined batch must be projected again, never twice.
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import cache
from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine

from processor.core.fold import decide
from processor.core.state import PartitionState
from projections import models
from projections.envelope import Envelope, ProjectionError
from projections.offsets import lock_offsets
from projections.pipeline import Pipeline
from projections.projector import Projector, plan_batch
from projections.rebuild import content_hashes
from projections.runner import run
from projections.usage import DEFAULT_LATENESS_MS
from schemas.commands import AddNode, Command, Defragment, Release, RemoveNode, SetPolicy, SubmitPod, Tick
from tests import workload
from tests.unit.projections.test_handlers_budgets import events_by_step
from tests.unit.projections.test_handlers_gangs import retry_stream
from tests.unit.projections.test_handlers_gangs import stream as gang_stream

SOURCE = "gpufold.events"


def _nodes_come_and_go() -> list:
    """Migrations, preemptions, a node removed and added again under the same id, pods released and reused."""
    payloads: list[object] = [SetPolicy("spread", reserve_after_ms=-1)]
    payloads += [AddNode(f"n{i}", 64_000, 262_144, "A100", 2) for i in range(3)]
    payloads += [SubmitPod(f"s{i}", "t", 0, 1, 300, 1000, 1024, movable=True) for i in range(3)]
    payloads += [SubmitPod("w", "t", 0, 2, 1000, 1000, 1024, preemption="never"), SetPolicy("best-fit")]
    payloads += [Defragment(10), SubmitPod("low", "t", 0, 2, 1000, 1000, 1024)]
    payloads += [SubmitPod("big", "t", 9, 2, 1000, 1000, 1024), Release("big"), Release("low")]
    payloads += [RemoveNode("n2", force=True), AddNode("n2", 32_000, 131_072, "H100", 4)]
    payloads += [SubmitPod("big", "u", 0, 4, 1000, 1000, 1024), Tick(), Release("big")]
    payloads += [RemoveNode("n1", force=True), Tick(), AddNode("n1", 64_000, 262_144, "A100", 2)]
    commands = [Command(f"m-{i}", "c1", workload.START_MS + 600_000 * i, p) for i, p in enumerate(payloads)]  # type: ignore[arg-type]
    state = PartitionState()
    return [event for offset, command in enumerate(commands) for event in decide(state, command, offset)]


STREAMS = {  # each built once (cached): the events are immutable
    # Hours of usage sealed; pod-0000445 is evicted, then placed again directly (not from the queue).
    "workload": cache(lambda: workload.fold(workload.commands(1_000, nodes=12, seed=5, step_ms=20_000))),
    "gangs": cache(gang_stream),
    "nodes": cache(_nodes_come_and_go),
    # Budgets set, replaced and removed; drains blocked, cancelled and let through (issue #25).
    "budgets": cache(lambda: [event for _, events in events_by_step() for event in events]),
    # A gang and a pod retried after failures: member rows end, the gang waits, both start again.
    "retries": cache(retry_stream),
}


def _envelopes(events: list) -> list[Envelope]:
    return [Envelope.of(event, offset) for offset, event in enumerate(events)]


def _hashes(engine: Engine) -> dict:
    with engine.connect() as conn:
        return content_hashes(conn)


def _reference(events: list) -> dict:
    engine = create_engine("sqlite://")
    models.Base.metadata.create_all(engine)
    Projector(engine, SOURCE).project(_envelopes(events))
    return _hashes(engine)


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    """A SQLite file: the pipeline reads and writes through two connections at once."""
    eng = create_engine(f"sqlite:///{tmp_path / 'read.sqlite'}")
    models.Base.metadata.create_all(eng)
    yield eng
    eng.dispose()


CASES = [
    ("gangs", 1),
    ("gangs", 7),
    ("nodes", 1),
    ("nodes", 7),
    ("workload", 5),
    ("workload", 200),
    ("budgets", 1),
    ("budgets", 3),
    ("retries", 1),
    ("retries", 4),
]


@pytest.mark.parametrize(("name", "size"), CASES)
def test_unpipelined_batches_give_the_tables_of_one_batch(name: str, size: int) -> None:
    """Also without the pipeline: a migration in a later batch than its nodes, an evicted pod placed again."""
    events = STREAMS[name]()
    engine = create_engine("sqlite://")
    models.Base.metadata.create_all(engine)
    projector = Projector(engine, SOURCE)
    batch = _envelopes(events)
    for i in range(0, len(batch), size):
        projector.project(batch[i : i + size])
    assert _hashes(engine) == _reference(events)


@pytest.mark.parametrize(("name", "size"), CASES)
def test_pipelined_batches_give_the_tables_of_one_batch(engine: Engine, name: str, size: int) -> None:
    events = STREAMS[name]()
    batch = _envelopes(events)
    pipeline = Pipeline(Projector(engine, SOURCE))
    results = []
    for i in range(0, len(batch), size):
        results += pipeline.submit(batch[i : i + size])
    results += pipeline.drain()
    pipeline.close()
    assert sum(r.applied for r in results) == len(events)
    assert pipeline.replays == 0, "nothing moved the offsets: no batch may have been projected twice"
    assert _hashes(engine) == _reference(events)


def test_the_runner_pipelines_when_asked_and_gives_the_same_tables(engine: Engine) -> None:
    events = STREAMS["workload"]()

    class Source:
        name = SOURCE

        def __init__(self) -> None:
            self.left = _envelopes(events)

        def start(self, positions: object) -> None:
            pass

        def poll(self, max_records: int, timeout: float) -> list[Envelope]:
            out, self.left = self.left[:max_records], self.left[max_records:]
            return out

        def caught_up(self) -> bool:
            return not self.left

        def lag(self) -> int:
            return len(self.left)

        def close(self) -> None:
            pass

    stats = run(
        Projector(engine, SOURCE), Source(), batch_size=50, poll_timeout=0.0, stop_when_idle=True, pipeline=True
    )  # type: ignore[arg-type]
    assert stats.events == len(events) and stats.duplicates == 0
    assert _hashes(engine) == _reference(events)


def test_a_batch_applied_on_offsets_that_moved_is_projected_again_not_twice(engine: Engine) -> None:
    """Another projector commits the next events while a pipelined batch is applied on the old offsets:
    the pipelined write finds the offsets moved, writes nothing, and the batch is projected again."""
    events = STREAMS["workload"]()
    batch = _envelopes(events)
    first, second, rest = batch[:300], batch[300:600], batch[600:]
    pipeline = Pipeline(Projector(engine, SOURCE))
    assert pipeline.submit(first) == []  # in flight
    future, _ = pipeline._inflight  # type: ignore[misc]
    future.result()  # committed; the pipeline still holds the rows as that batch left them
    Projector(engine, SOURCE).project(second)  # another member of the group gets there first
    results = pipeline.submit(second)  # applied on top of ``first``, as if nobody else had written
    results += pipeline.submit(rest)
    results += pipeline.drain()
    pipeline.close()
    assert pipeline.replays == 1
    assert sum(r.duplicates for r in results) == len(second)
    assert sum(r.applied for r in results) == len(first) + len(rest)
    assert _hashes(engine) == _reference(events)


def test_a_gap_is_refused_and_the_batch_before_it_still_commits(engine: Engine) -> None:
    events = STREAMS["workload"]()
    batch = _envelopes(events)
    pipeline = Pipeline(Projector(engine, SOURCE))
    pipeline.submit(batch[:100])
    with pytest.raises(ProjectionError, match="events are missing"):
        pipeline.submit(batch[150:200])
    pipeline.close()
    with engine.connect() as conn:
        assert conn.execute(models.projection_offsets.select()).one().next_sequence == 100


def test_a_planned_batch_writes_its_rows_as_it_left_them_whatever_the_next_batch_changes() -> None:
    """The rows a pipelined batch writes are copies: the next batch, applied on top of them before they are
    written, changes nodes' free GPUs and pods' statuses without reaching them."""
    events = STREAMS["workload"]()
    half = len(events) // 2
    first, second = _envelopes(events)[:half], _envelopes(events)[half:]
    engine = create_engine("sqlite://")
    models.Base.metadata.create_all(engine)
    with engine.connect() as conn, conn.begin():
        offsets = lock_offsets(conn, SOURCE, [0])
        planned = plan_batch(conn, SOURCE, first, offsets, DEFAULT_LATENESS_MS, snapshot=True)
        plan_batch(conn, SOURCE, second, dict(planned.end), DEFAULT_LATENESS_MS, planned.work, snapshot=True)
        planned.write(conn)
    assert _hashes(engine) == _reference(events[:half])
