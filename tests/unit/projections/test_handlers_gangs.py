"""The read side of jobs that span nodes: gangs, their members and state, and reservations."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, create_engine, select

from processor.core.fold import decide
from processor.core.state import PartitionState
from projections import models, queries
from projections.envelope import Envelope
from projections.projector import Projector
from projections.rebuild import content_hashes
from schemas.commands import (
    AddNode,
    Command,
    GangMember,
    MarkNodeFailed,
    Release,
    ReleaseGang,
    Retry,
    SetPolicy,
    SubmitGang,
    SubmitPod,
    Tick,
)

MINUTE = 60_000


def rack_gang(gang_id: str, size: int, **options: object) -> SubmitGang:
    members = tuple(GangMember(f"{gang_id}-{i}", 8, 1000, 4000, 16384) for i in range(size))
    return SubmitGang(gang_id, "research", members=members, topology_required="topology/rack", **options)  # type: ignore[arg-type]


def stream() -> list:
    """Two racks of two 8-GPU nodes; gangs that run, wait, restart after a failure and end; a reservation."""
    payloads: list[tuple[int, object]] = [(0, SetPolicy("first-fit", reserve_after_ms=MINUTE))]
    for i in range(4):
        payloads.append((0, AddNode(f"n{i}", 64_000, 262_144, "H100", 8, {"topology/rack": f"r{i // 2}"})))
    payloads += [
        (MINUTE, rack_gang("a", 2, time_limit_ms=10 * MINUTE)),
        (MINUTE, rack_gang("b", 2)),
        (2 * MINUTE, rack_gang("c", 2)),  # no rack free: pending, and reserved for after a minute
        (2 * MINUTE, SubmitPod("after-b", cpu_milli=1000, depends_on=("b",))),  # waits for b
        (4 * MINUTE, Tick()),
        (5 * MINUTE, MarkNodeFailed("n2")),  # b loses a member: evicted, back to the queue
        (6 * MINUTE, ReleaseGang("b", "cancelled")),  # b ends while queued; after-b fails
        (20 * MINUTE, Tick()),  # a's time limit passes: c starts on a's rack
    ]
    state = PartitionState()
    events = []
    for offset, (at, payload) in enumerate(payloads):
        events.extend(decide(state, Command(f"c{offset}", "lab", at, payload), offset))  # type: ignore[arg-type]
    return events


@pytest.fixture
def engine() -> Iterator[Engine]:
    eng = create_engine("sqlite://")
    models.Base.metadata.create_all(eng)
    yield eng
    eng.dispose()


def project(engine: Engine, events: list, size: int = 1000) -> None:
    projector = Projector(engine, "gpufold.events")
    batch = [Envelope.of(event, event.command_offset) for event in events]
    for i in range(0, len(batch), size):
        projector.project(batch[i : i + size])


def test_gangs_are_projected_with_members_state_and_domain(engine: Engine) -> None:
    events = stream()
    project(engine, events)
    with engine.connect() as conn:
        answer = queries.gangs(conn, cluster="lab")
        by_id = {gang["gang_id"]: gang for gang in answer["gangs"]}
        assert by_id["a"]["status"] == "released" and by_id["a"]["end_reason"] == "time_limit"
        assert by_id["a"]["ended_ok"] is False and by_id["a"]["domain"] == "r0"
        assert by_id["b"]["status"] == "released" and by_id["b"]["end_reason"] == "cancelled"
        assert by_id["c"]["status"] == "running" and by_id["c"]["domain"] == "r0"
        assert [m["pod_id"] for m in by_id["c"]["members"]] == ["c-0", "c-1"]
        assert {p["node_id"] for p in by_id["c"]["placed"]} == {"n0", "n1"}
        # b's members were evicted with it and ended when it did: no member row is left behind.
        rows = {r.pod_id: r.status for r in conn.execute(select(models.pods.c.pod_id, models.pods.c.status))}
        assert rows["b-0"] == rows["b-1"] == "released"
        assert rows["after-b"] == "released"  # its afterok dependency was cancelled


def test_pending_shows_waiting_gangs_their_reasons_and_the_reservation(engine: Engine) -> None:
    events = stream()
    cut = next(i for i, e in enumerate(events) if e.type_name == "NodesReserved") + 1
    project(engine, events[:cut])
    with engine.connect() as conn:
        answer = queries.pending(conn, cluster="lab")
    (gang,) = answer["gangs"]
    assert gang["gang_id"] == "c" and gang["status"] == "pending"
    assert gang["reasons_when_queued"][0]["code"] == "TOPOLOGY_DOMAIN_TOO_SMALL"
    assert "largest free one" in gang["reasons_when_queued"][0]["message"]
    held = answer["reservation"]
    assert held["holder_id"] == "c" and held["holder_kind"] == "gang" and held["nodes"]
    assert held["expected_start"] == 11 * MINUTE  # a's time limit frees rack r0
    assert [pod["pod_id"] for pod in answer["pods"]] == ["after-b"]  # waiting for b, reason says so
    assert answer["pods"][0]["reasons_when_queued"][0]["code"] == "WAITING_FOR_DEPENDENCY"


def test_the_reservation_goes_when_its_holder_starts(engine: Engine) -> None:
    project(engine, stream())
    with engine.connect() as conn:
        assert queries.reservations(conn) == {"reservations": []}
        assert queries.pending(conn, cluster="lab")["reservation"] is None


def test_gang_tables_do_not_depend_on_batch_boundaries() -> None:
    """One event per batch and all events in one batch give identical gang and reservation tables."""
    events = stream()
    small, large = create_engine("sqlite://"), create_engine("sqlite://")
    for eng in (small, large):
        models.Base.metadata.create_all(eng)
    project(small, events, 1)
    project(large, events, 10_000)
    with small.connect() as a, large.connect() as b:
        assert content_hashes(a) == content_hashes(b)


def test_unknown_states_and_clusters_are_clear_errors(engine: Engine) -> None:
    project(engine, stream())
    with engine.connect() as conn:
        with pytest.raises(queries.QueryError, match="state must be one of"):
            queries.gangs(conn, cluster="lab", state="sleeping")
        with pytest.raises(queries.NotFound):
            queries.gangs(conn, cluster="nowhere")


def retry_stream() -> list:
    """A rack of two 8-GPU nodes and one more node; gang r (SubmitGang.retry) whose member fails, waits for its
    retry and starts again; a pod waits for r; a pod on its own (SubmitPod.retry) fails and is retried too."""
    payloads: list[tuple[int, object]] = [(0, SetPolicy("first-fit"))]
    for i in range(3):
        payloads.append((0, AddNode(f"n{i}", 64_000, 262_144, "H100", 8, {"topology/rack": f"r{i // 2}"})))
    payloads += [
        (MINUTE, rack_gang("r", 2, retry=Retry(2, MINUTE))),
        (MINUTE, SubmitPod("after-r", cpu_milli=1000, depends_on=("r",))),
        (MINUTE, SubmitPod("solo", num_gpu=1, gpu_milli=1000, retry=Retry(1, MINUTE))),
        (2 * MINUTE, Release("r-1", "failed")),  # r-0 evicted with it; the gang is retried at 3 minutes
        (4 * MINUTE, Tick()),
        (5 * MINUTE, Release("solo", "failed")),  # alone in its batch of one: its node is found all the same
        (7 * MINUTE, Tick()),
    ]
    state = PartitionState()
    events = []
    for offset, (at, payload) in enumerate(payloads):
        events.extend(decide(state, Command(f"c{offset}", "lab", at, payload), offset))  # type: ignore[arg-type]
    return events


def test_a_gang_waiting_for_its_retry_is_pending_with_the_reason_then_runs_again(engine: Engine) -> None:
    """PodRetryScheduled of a member (gang_id set): the gang is pending with WAITING_FOR_RETRY, its member rows end
    and its nodes are free; at the retry it runs again with fresh member rows; its dependant still waits."""
    events = retry_stream()
    cut = next(i for i, e in enumerate(events) if e.type_name == "PodRetryScheduled") + 1
    assert events[cut - 1].payload.gang_id == "r"
    project(engine, events[:cut])
    with engine.connect() as conn:
        (gang,) = queries.pending(conn, cluster="lab")["gangs"]
        assert gang["gang_id"] == "r" and gang["status"] == "pending"
        assert gang["reasons_when_queued"][0]["code"] == "WAITING_FOR_RETRY"
        rows = {r.pod_id: (r.status, r.node_id) for r in conn.execute(select(models.pods))}
        assert rows["r-0"] == ("released", None) and rows["r-1"] == ("released", None)
        nodes = {r.node_id: r.pods_running for r in conn.execute(select(models.nodes))}
        assert nodes == {"n0": 0, "n1": 0, "n2": 1}
    project(engine, events[cut:])
    with engine.connect() as conn:
        (gang,) = [g for g in queries.gangs(conn, cluster="lab")["gangs"] if g["gang_id"] == "r"]
        assert gang["status"] == "running" and {p["node_id"] for p in gang["placed"]} == {"n0", "n1"}
        rows = {r.pod_id: r.status for r in conn.execute(select(models.pods.c.pod_id, models.pods.c.status))}
        assert rows["r-0"] == rows["r-1"] == rows["solo"] == "running" and rows["after-r"] == "pending"
        (waiting,) = queries.pending(conn, cluster="lab")["pods"]
        assert waiting["pod_id"] == "after-r"
        assert waiting["reasons_when_queued"][0]["code"] == "WAITING_FOR_DEPENDENCY"


def test_gang_retry_tables_do_not_depend_on_batch_boundaries() -> None:
    """One event per batch and all events in one batch give identical tables through a gang's and a pod's retry
    (a PodRetryScheduled names no node: the staging finds the node its pod runs on)."""
    events = retry_stream()
    small, large = create_engine("sqlite://"), create_engine("sqlite://")
    for eng in (small, large):
        models.Base.metadata.create_all(eng)
    project(small, events, 1)
    project(large, events, 10_000)
    with small.connect() as a, large.connect() as b:
        assert content_hashes(a) == content_hashes(b)


def test_an_elastic_gangs_waiting_member_is_a_pending_row_until_its_gang_goes_back_to_the_queue(engine: Engine) -> None:
    """Contract v4: a member beyond min_members that did not fit is a pending pod row (GANG_MEMBER_WAITING first);
    when the gang is requeued that row ends with the gang's evicted members, and no row is left behind."""
    payloads: list[tuple[int, object]] = [(0, SetPolicy("first-fit", reserve_after_ms=-1))]
    payloads += [(0, AddNode(f"n{i}", 64_000, 262_144, "H100", 8)) for i in range(2)]
    payloads += [
        (MINUTE, SubmitPod("x", num_gpu=8, gpu_milli=1000, cpu_milli=1000, memory_mib=1024)),
        (
            MINUTE,
            SubmitGang("e", members=tuple(GangMember(f"e-{i}", 8, 1000, 4000, 16384) for i in range(2)), min_members=1),
        ),
    ]
    state = PartitionState()
    events = []
    for offset, (at, payload) in enumerate(payloads):
        events.extend(decide(state, Command(f"c{offset}", "lab", at, payload), offset))  # type: ignore[arg-type]
    project(engine, events)
    with engine.connect() as conn:
        rows = {r.pod_id: r.status for r in conn.execute(select(models.pods.c.pod_id, models.pods.c.status))}
        assert rows["e-0"] == "running" and rows["e-1"] == "pending"
    placed = state.clusters["lab"].pods["e-0"].node_id
    more = decide(state, Command("c9", "lab", 2 * MINUTE, MarkNodeFailed(placed)), 9)
    assert "GangQueued" in [e.type_name for e in more]
    project(engine, more)
    with engine.connect() as conn:
        rows = {r.pod_id: r.status for r in conn.execute(select(models.pods.c.pod_id, models.pods.c.status))}
        assert rows["e-0"] == rows["e-1"] == "released"
