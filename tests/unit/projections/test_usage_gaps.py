"""Gaps in event time never make the projector work or allocate in proportion to the gap (issue 12, class 1).

One command with a far-future ``issued_at`` (or, in an old log, an event beyond the contract's range), or a
pod started decades late, used to make the projector write one usage row per hour of the gap: for year
2100 it ran for minutes, for 2^62 it ran out of memory. Now such a gap costs a few rows (spans of whole
hours), takes milliseconds, and the usage it implies is still charged exactly.
"""

from __future__ import annotations

import dataclasses
import time
from collections import defaultdict
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Engine, create_engine, func, select

from projections import models, queries
from projections.envelope import Envelope
from projections.projector import Projector
from projections.rebuild import table_hash
from projections.usage import HOUR_MS, SPAN_HOURS, pieces
from schemas.commands import AddNode, Command, Release, SetPolicy, SubmitPod, Tick
from schemas.events import Event
from schemas.limits import MAX_ISSUED_AT
from tests import workload

T0 = workload.START_MS
YEAR_2099 = MAX_ISSUED_AT - HOUR_MS


def engine() -> Engine:
    eng = create_engine("sqlite://")
    models.Base.metadata.create_all(eng)
    return eng


def project(eng: Engine, events: list[Event], batch: int = 10_000) -> float:
    envelopes = [Envelope.of(e, i) for i, e in enumerate(events)]
    started = time.perf_counter()
    projector = Projector(eng, "events")
    for i in range(0, len(envelopes), batch):
        projector.project(envelopes[i : i + batch])
    return time.perf_counter() - started


def rows(eng: Engine) -> int:
    usage_tables = (
        models.usage_hours,
        models.tenant_usage,
        models.usage_adjustments,
        models.tenant_usage_spans,
        models.usage_adjustment_spans,
    )
    with eng.connect() as conn:
        return sum(conn.execute(select(func.count()).select_from(t)).scalar_one() for t in usage_tables)


def charged(eng: Engine) -> dict[str, int]:
    """milli-ms per tenant over all of event time: hour rows, adjustments and spans (hours x per-hour amount)."""
    totals: dict[str, int] = defaultdict(int)
    with eng.connect() as conn:
        for table in (models.tenant_usage, models.usage_adjustments):
            for row in conn.execute(select(table)):
                totals[row.tenant] += row.gpu_milli_ms
        for table in (models.tenant_usage_spans, models.usage_adjustment_spans):
            for row in conn.execute(select(table)):
                totals[row.tenant] += row.hours * row.gpu_milli_ms_per_hour
        # The usage query agrees (to its rounding) with the rows, over all of event time.
        reported: dict[str, float] = defaultdict(float)
        for item in queries.tenant_usage(conn, start=0, end=MAX_ISSUED_AT + 1, granularity="day"):
            reported[item["tenant"]] += item["gpu_hours"]
    for tenant, total in totals.items():
        assert abs(reported[tenant] - total / queries.MILLI_MS_PER_GPU_HOUR) <= 1e-3 * max(1, len(reported)) + 1e-9 * (
            total / queries.MILLI_MS_PER_GPU_HOUR
        )
    return {t: v for t, v in totals.items() if v}


def expected(eng: Engine, events: list[Event]) -> dict[str, int]:
    """sum(milli x run time) per tenant; running pods up to their tenant's rate clock."""
    with eng.connect() as conn:
        since = {r.tenant: r.since for r in conn.execute(select(models.tenant_rates))}
    started: dict[str, tuple[str, int, int]] = {}
    totals: dict[str, int] = defaultdict(int)
    for event in events:
        payload: Any = event.payload
        name = type(payload).__name__
        t = min(event.occurred_at, MAX_ISSUED_AT)
        if name == "PodScheduled":
            started[payload.pod.pod_id] = (payload.pod.tenant, payload.pod.gpu_milli_total, t)
        elif name in ("PodEvicted", "PodReleased") and payload.pod_id in started:
            tenant, milli, begin = started.pop(payload.pod_id)
            totals[tenant] += milli * (max(t, begin) - begin)
    for tenant, milli, begin in started.values():
        totals[tenant] += milli * (since[tenant] - begin)
    return {t: v for t, v in totals.items() if v}


def running_cluster(t: int = T0) -> list[Command]:
    return [
        Command("a1", "c1", t, AddNode("n1", 64_000, 65_536, "A10", 8)),
        Command("a2", "c1", t + 1_000, SubmitPod("p1", "acme", 0, 2, 1000, 1000, 1024)),
        Command("a3", "c1", t + 2_000, SubmitPod("p2", "beta", 0, 1, 500, 1000, 1024)),
    ]


def test_pieces_are_at_most_three_whatever_the_length() -> None:
    """A credit over decades is a partial hour, one run of whole hours and a partial hour."""
    assert list(pieces(10, MAX_ISSUED_AT)) == [
        (0, 1, HOUR_MS - 10),
        (HOUR_MS, MAX_ISSUED_AT // HOUR_MS - 1, HOUR_MS),
        (MAX_ISSUED_AT - MAX_ISSUED_AT % HOUR_MS, 1, MAX_ISSUED_AT % HOUR_MS),
    ]
    assert list(pieces(HOUR_MS, 3 * HOUR_MS)) == [(HOUR_MS, 2, HOUR_MS)]
    assert list(pieces(5, 5)) == []


def test_a_command_issued_in_2099_seals_73_years_in_a_few_rows() -> None:
    """Pods running when the watermark jumps to 2099: the projector finishes at once, charging every hour."""
    eng = engine()
    events = workload.fold([*running_cluster(), Command("far", "c1", YEAR_2099, Tick(force=True))])
    assert project(eng, events) < 5.0
    assert rows(eng) < 20
    assert charged(eng) == expected(eng, events)
    with eng.connect() as conn:
        (clock,) = conn.execute(select(models.usage_clocks)).all()
        spans = conn.execute(select(models.tenant_usage_spans)).all()
    assert clock.sealed_until >= YEAR_2099 - 2 * HOUR_MS
    assert {span.tenant for span in spans} == {"acme", "beta"}
    assert all(span.hours > 600_000 for span in spans)


def test_a_pod_started_decades_late_is_one_adjustment_span() -> None:
    """A pod scheduled at issued_at 0 into a cluster at 2026 is charged 56 years, as one adjustment span."""
    eng = engine()
    late = Command("late", "c1", T0 + 3_000, SubmitPod("old", "gamma", 0, 1, 1000, 1, 1))
    later = Command("later", "c1", T0 + 3 * HOUR_MS, SetPolicy("spread"))  # seals the hours gamma ran in
    events = workload.fold([*running_cluster(), late, later])
    # Today's fold stamps a late command at its clock; a v1 log keeps the command's own time (0 here).
    (at,) = [i for i, e in enumerate(events) if e.command_id == "late"]
    events[at] = dataclasses.replace(events[at], occurred_at=0)
    assert project(eng, events) < 5.0
    assert rows(eng) < 20
    assert charged(eng) == expected(eng, events)
    with eng.connect() as conn:
        (span,) = conn.execute(select(models.usage_adjustment_spans)).all()
    assert span.tenant == "gamma" and span.hours > 400_000


def test_a_time_beyond_the_range_never_moves_the_clock() -> None:
    """A rejection of a µs issued_at, or an old log's pod event at 2^62, leaves the watermark where it was."""
    eng = engine()
    rejected = Command("us", "c1", 1_767_225_600_000_000, SetPolicy("spread"))  # microseconds: TIME_OUT_OF_RANGE
    events = workload.fold([*running_cluster(), rejected, Command("x", "c1", T0 + 5_000, Release("p2"))])
    assert events[-2].payload.code == "TIME_OUT_OF_RANGE"  # type: ignore[union-attr]
    events[-1] = dataclasses.replace(events[-1], occurred_at=1 << 62)  # as an old log may hold it
    assert project(eng, events) < 5.0
    assert rows(eng) < 20
    with eng.connect() as conn:
        (clock,) = conn.execute(select(models.usage_clocks)).all()
    assert clock.watermark == T0 + 2_000  # the last time in range
    assert charged(eng) == expected(eng, [e for e in events if e.occurred_at <= MAX_ISSUED_AT])


def test_top_consumers_counts_whole_hours_of_spans() -> None:
    """top_consumers over a range inside a span charges exactly the span's hours in the range."""
    eng = engine()
    events = workload.fold([*running_cluster(), Command("far", "c1", YEAR_2099, Tick(force=True))])
    project(eng, events)
    start = T0 + 100 * HOUR_MS
    with eng.connect() as conn:
        top = queries.top_consumers(conn, start=start, end=start + 1000 * HOUR_MS)
        usage = queries.tenant_usage(conn, start=start, end=start + 3 * HOUR_MS, tenant="acme")
    assert top == [
        {"rank": 1, "tenant": "acme", "gpu_hours": 2000.0},
        {"rank": 2, "tenant": "beta", "gpu_hours": 500.0},
    ]
    assert [item["gpu_hours"] for item in usage] == [2.0, 2.0, 2.0] and all(item["sealed"] for item in usage)


# ------------------------------------------------------------------ generated gaps

JUMPS = st.one_of(
    st.integers(0, 10 * 60_000),  # ordinary steps
    st.integers(SPAN_HOURS * HOUR_MS, 60 * 365 * 24 * HOUR_MS),  # forward by a day to 60 years
    st.integers(-40 * 365 * 24 * HOUR_MS, -1),  # backwards: late commands, up to 40 years
)


@st.composite
def gappy_streams(draw: st.DrawFn) -> list[Command]:
    """A small cluster's commands whose issued_at jumps forward and back by up to decades."""
    commands = [Command("n1", "c1", T0, AddNode("n1", 64_000, 65_536, "A10", 8))]
    t = T0
    for i in range(draw(st.integers(3, 25))):
        t = min(max(0, t + draw(JUMPS)), MAX_ISSUED_AT)
        kind = draw(st.sampled_from(("submit", "submit", "release", "tick")))
        if kind == "submit":
            payload: Any = SubmitPod(f"p{i}", draw(st.sampled_from(("t1", "t2"))), 0, 1, 250 * draw(st.integers(1, 4)))
        elif kind == "release":
            payload = Release(f"p{draw(st.integers(0, max(0, i - 1)))}")
        else:
            payload = SetPolicy("first-fit")
        commands.append(Command(f"c{i}", "c1", t, payload))
    return commands


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(commands=gappy_streams(), batch=st.integers(1, 7))
def test_any_gaps_cost_rows_per_event_and_charge_exactly(commands: list[Command], batch: int) -> None:
    """Whatever the jumps: rows grow with events not hours, usage is exact, batching changes nothing."""
    # Stamped as contract v1 stamps them (each event at its command's own time, late or not), so late
    # commands make late events; today's fold would stamp them at its clock.
    events = [dataclasses.replace(e, occurred_at=commands[e.command_offset].issued_at) for e in workload.fold(commands)]
    whole, batched = engine(), engine()
    project(whole, events)
    project(batched, events, batch=batch)
    assert rows(whole) <= 12 * len(events) + 12
    assert charged(whole) == expected(whole, events)
    with whole.connect() as a, batched.connect() as b:
        for table in models.TABLES:
            assert table_hash(a, table) == table_hash(b, table), table.name
