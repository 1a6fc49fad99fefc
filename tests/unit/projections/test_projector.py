"""The projector on SQLite: exactly-once application, batching independence, agreement with the fold."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, select

from processor.core.fold import decide
from processor.core.state import PartitionState
from projections import models
from projections.envelope import Envelope, ProjectionError
from projections.projector import Projector
from projections.rebuild import content_hashes
from tests import workload

SOURCE = "gpufold.events"


@pytest.fixture(scope="module")
def events() -> list:
    return workload.fold(workload.commands(2_500, nodes=12, seed=3, step_ms=20_000))


@pytest.fixture
def engine() -> Iterator[Engine]:
    eng = create_engine("sqlite://")
    models.Base.metadata.create_all(eng)
    yield eng
    eng.dispose()


def envelopes(events: list) -> list[Envelope]:
    return [Envelope.of(event, offset) for offset, event in enumerate(events)]


def project(engine: Engine, batch: list[Envelope], size: int = 5_000) -> list:
    projector = Projector(engine, SOURCE)
    return [projector.project(batch[i : i + size]) for i in range(0, len(batch), size)]


def hashes(engine: Engine) -> dict:
    with engine.connect() as conn:
        return content_hashes(conn)


def test_replaying_every_batch_changes_nothing(engine: Engine, events: list) -> None:
    """Projecting the same events again skips them all as duplicates and leaves every table as it was."""
    batch = envelopes(events)
    project(engine, batch, 700)
    before = hashes(engine)
    results = project(engine, batch, 700)
    assert sum(r.applied for r in results) == 0
    assert sum(r.duplicates for r in results) == len(events)
    assert hashes(engine) == before


def test_tables_do_not_depend_on_batch_boundaries(events: list) -> None:
    """Batches of 97 events and one batch of all of them produce identical tables (sealing is per event)."""
    small, large = create_engine("sqlite://"), create_engine("sqlite://")
    for eng in (small, large):
        models.Base.metadata.create_all(eng)
    project(small, envelopes(events), 97)
    project(large, envelopes(events), len(events))
    assert hashes(small) == hashes(large)
    with small.connect() as conn:
        assert conn.execute(select(models.usage_hours).where(models.usage_hours.c.status == "sealed")).first()


def test_projection_agrees_with_the_fold_state(engine: Engine, events: list) -> None:
    """Running pods, pending pods and each node's free GPU shares equal the fold's own state."""
    state = PartitionState()
    for offset, command in enumerate(workload.commands(2_500, nodes=12, seed=3, step_ms=20_000)):
        decide(state, command, offset)
    project(engine, envelopes(events), 1_000)
    cluster = state.clusters["c1"]
    with engine.connect() as conn:
        pods = {r.pod_id: r for r in conn.execute(select(models.pods))}
        nodes = {r.node_id: r for r in conn.execute(select(models.nodes))}
        allocations = list(conn.execute(select(models.allocations)))
    running = {pod_id for pod_id, pod in cluster.pods.items() if pod.running}
    queued = {pod_id for pod_id, pod in cluster.pods.items() if pod.queued}
    assert {p for p, r in pods.items() if r.status == "running"} == running
    assert {p for p, r in pods.items() if r.status == "pending"} == queued
    assert set(nodes) == set(cluster.nodes)
    for node_id, node in cluster.nodes.items():
        assert nodes[node_id].gpu_free == node.gpu_free
        assert nodes[node_id].failed == node.failed
        assert nodes[node_id].cordoned == node.cordoned
    assert sum(a.milli for a in allocations) == cluster.gpu_milli_allocated
    assert {(a.pod_id, a.gpu_index) for a in allocations} == {
        (pod_id, share.index) for pod_id, pod in cluster.pods.items() if pod.running for share in pod.gpus
    }


def test_kept_totals_equal_totals_counted_from_the_rows(engine: Engine, events: list) -> None:
    """The per-model GPU totals and the pending/running counts equal what the node and pod rows add up to."""
    project(engine, envelopes(events), 333)
    with engine.connect() as conn:
        nodes = list(conn.execute(select(models.nodes)))
        pods = list(conn.execute(select(models.pods)))
        totals = {(r.gpu_model): r for r in conn.execute(select(models.gpu_totals))}
        stats = conn.execute(select(models.cluster_stats)).one()
    for model, row in totals.items():
        mine = [n for n in nodes if n.gpu_model == model]
        assert row.nodes == len(mine)
        assert row.capacity_milli == sum(0 if n.failed else n.gpu_count * 1000 for n in mine)
        assert row.allocated_milli == sum(n.gpu_milli_allocated for n in mine)
        assert row.pods_running == sum(n.pods_running for n in mine)
    assert stats.pending == sum(p.status == "pending" for p in pods)
    assert stats.running == sum(p.status == "running" for p in pods)


def test_a_gap_in_the_sequence_is_refused_and_writes_nothing(engine: Engine, events: list) -> None:
    """Events missing before a batch raise ProjectionError and roll the whole batch back."""
    batch = envelopes(events)
    project(engine, batch[:100])
    before = hashes(engine)
    with pytest.raises(ProjectionError, match="expected event sequence 100"):
        project(engine, batch[101:200])
    assert hashes(engine) == before


def test_an_overlapping_batch_applies_only_the_new_events(engine: Engine, events: list) -> None:
    """A batch that starts before the stored position applies exactly the events past it."""
    batch = envelopes(events)
    project(engine, batch[:300])
    (result,) = project(engine, batch[200:450])
    assert (result.applied, result.duplicates) == (150, 100)
    with engine.connect() as conn:
        offsets = conn.execute(select(models.projection_offsets)).one()
        audited = conn.execute(select(models.audit_events.c.sequence)).scalars().all()
    assert (offsets.next_offset, offsets.next_sequence) == (450, 450)
    assert sorted(audited) == list(range(450))


def test_undecodable_records_are_counted_and_passed(engine: Engine, events: list) -> None:
    """A record whose bytes did not decode moves the offset on without touching the tables."""
    batch = [*envelopes(events[:5]), Envelope(0, 5, None, b"junk", "bad magic")]
    (result,) = project(engine, batch)
    assert (result.applied, result.undecodable) == (5, 1)
    with engine.connect() as conn:
        offsets = conn.execute(select(models.projection_offsets)).one()
    assert (offsets.next_offset, offsets.next_sequence) == (6, 5)


def test_every_event_is_audited_with_its_command(engine: Engine, events: list) -> None:
    """The audit log holds each event once, with its command id and command offset."""
    project(engine, envelopes(events), 500)
    with engine.connect() as conn:
        rows = conn.execute(select(models.audit_events).order_by(models.audit_events.c.sequence)).all()
    assert [(r.sequence, r.command_id, r.command_offset, r.type) for r in rows] == [
        (e.sequence, e.command_id, e.command_offset, e.type_name) for e in events
    ]


def test_migrations_and_preemptions_project_like_the_fold() -> None:
    """After Defragment moves and priority preemptions, node GPU shares and allocations equal the fold's."""
    from schemas.commands import AddNode, Command, Defragment, SetPolicy, SubmitPod

    payloads: list[object] = [SetPolicy("spread", reserve_after_ms=-1)]
    payloads += [AddNode(f"n{i}", 64_000, 262_144, "A100", 2) for i in range(3)]
    payloads += [SubmitPod(f"s{i}", "t", 0, 1, 300, 1000, 1024, movable=True) for i in range(3)]
    payloads += [SubmitPod("w", "t", 0, 2, 1000, 1000, 1024, preemption="never"), SetPolicy("best-fit")]
    payloads += [
        Defragment(10),
        SubmitPod("low", "t", 0, 2, 1000, 1000, 1024),
        SubmitPod("big", "t", 9, 2, 1000, 1000, 1024),
    ]
    commands = [Command(f"m-{i}", "c1", workload.START_MS + 1000 * i, p) for i, p in enumerate(payloads)]  # type: ignore[arg-type]
    state = PartitionState()
    events = [event for offset, command in enumerate(commands) for event in decide(state, command, offset)]
    assert {"PodMigrated", "PodPreempted"} <= {event.type_name for event in events}
    engine = create_engine("sqlite://")
    models.Base.metadata.create_all(engine)
    project(engine, envelopes(events))
    cluster = state.clusters["c1"]
    with engine.connect() as conn:
        nodes = {r.node_id: r for r in conn.execute(select(models.nodes))}
        allocations = list(conn.execute(select(models.allocations)))
        pods = {r.pod_id: r for r in conn.execute(select(models.pods))}
    for node_id, node in cluster.nodes.items():
        assert nodes[node_id].gpu_free == node.gpu_free
    assert {(a.pod_id, a.gpu_index) for a in allocations} == {
        (pod_id, share.index) for pod_id, pod in cluster.pods.items() if pod.running for share in pod.gpus
    }
    assert {p for p, r in pods.items() if r.status == "running"} == {
        p for p, pod in cluster.pods.items() if pod.running
    }
