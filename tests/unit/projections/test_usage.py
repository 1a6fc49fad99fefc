"""Usage accounting on SQLite: GPU time per tenant per hour, sealing, late usage as adjustments."""

from __future__ import annotations

from collections import defaultdict

import pytest
from sqlalchemy import Engine, create_engine, select

from projections import models
from projections.envelope import Envelope
from projections.projector import Projector
from projections.usage import HOUR_MS, seal_hour, split_hours
from schemas.commands import AddNode, Command, Release, SetPolicy, SubmitPod, V1Command
from tests import workload

T0 = workload.START_MS
MINUTE = 60_000


@pytest.fixture
def engine() -> Engine:
    eng = create_engine("sqlite://")
    models.Base.metadata.create_all(eng)
    return eng


def project(engine: Engine, events: list, lateness_ms: int = 5 * MINUTE) -> None:
    batch = [Envelope.of(e, i) for i, e in enumerate(events)]
    Projector(engine, "events", lateness_ms=lateness_ms).project(batch)


def usage_by_hour(engine: Engine, table) -> dict:  # type: ignore[no-untyped-def]
    out: dict = defaultdict(int)
    with engine.connect() as conn:
        for row in conn.execute(select(table)):
            out[(row.tenant, row.hour)] += row.gpu_milli_ms
    return dict(out)


def cmd(n: int, t: int, payload: object) -> Command:
    return Command(f"u-{n}", "c1", t, payload)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("start", "end", "expected"),
    [
        (T0, T0, []),
        (T0 + 10, T0 + 20, [(T0, 10)]),
        (T0 + HOUR_MS - 5, T0 + HOUR_MS + 7, [(T0, 5), (T0 + HOUR_MS, 7)]),
        (T0, T0 + 2 * HOUR_MS, [(T0, HOUR_MS), (T0 + HOUR_MS, HOUR_MS)]),
    ],
)
def test_split_hours(start: int, end: int, expected: list) -> None:
    """An interval is cut at hour boundaries, each piece attributed to its hour."""
    assert list(split_hours(start, end)) == expected


def test_each_pod_is_charged_its_gpu_time_split_by_hour(engine: Engine) -> None:
    """A 2-GPU pod running 90 minutes from :30 is charged 30 + 60 minutes of 2000 milli to two hours."""
    events = workload.fold(
        [
            cmd(1, T0, AddNode("n1", 64_000, 65_536, "A10", 8)),
            cmd(2, T0 + 30 * MINUTE, SubmitPod("p1", "acme", 0, 2, 1000, 1000, 1024)),
            cmd(3, T0 + 120 * MINUTE, Release("p1")),
        ]
    )
    project(engine, events)
    assert usage_by_hour(engine, models.tenant_usage) == {
        ("acme", T0): 2000 * 30 * MINUTE,
        ("acme", T0 + HOUR_MS): 2000 * 60 * MINUTE,
    }


def test_total_usage_equals_the_sum_of_pod_run_times() -> None:
    """Over a random workload, each tenant's usage is exactly sum(milli x run time) of its pods."""
    events = workload.fold(workload.commands(1_500, nodes=10, seed=11, step_ms=45_000))
    engine = create_engine("sqlite://")
    models.Base.metadata.create_all(engine)
    project(engine, events)
    with engine.connect() as conn:
        since = {r.tenant: r.since for r in conn.execute(select(models.tenant_rates))}
    started: dict[str, tuple[str, int, int]] = {}
    expected: dict[str, int] = defaultdict(int)
    for event in events:
        payload = event.payload
        name = type(payload).__name__
        if name == "PodScheduled":
            started[payload.pod.pod_id] = (payload.pod.tenant, payload.pod.gpu_milli_total, event.occurred_at)
        elif name in ("PodEvicted", "PodReleased") and payload.pod_id in started:
            tenant, milli, begin = started.pop(payload.pod_id)
            expected[tenant] += milli * (event.occurred_at - begin)
    for tenant, milli, begin in started.values():  # still running: charged up to the tenant's rate clock
        expected[tenant] += milli * (since[tenant] - begin)
    charged: dict[str, int] = defaultdict(int)
    for table in (models.tenant_usage, models.usage_adjustments):
        for (tenant, _), amount in usage_by_hour(engine, table).items():
            charged[tenant] += amount
    assert {t: v for t, v in charged.items() if v} == {t: v for t, v in expected.items() if v}


def test_late_usage_after_sealing_becomes_an_adjustment(engine: Engine) -> None:
    """A release that arrives after its hour was sealed leaves the sealed row alone and adds an adjustment.

    Today's fold stamps a late command with the partition's clock, so late events come from
    logs of contract v1, whose commands keep their own time (a V1Command here)."""
    events = workload.fold(
        [
            cmd(1, T0, AddNode("n1", 64_000, 65_536, "A10", 8)),
            cmd(2, T0 + 10 * MINUTE, SubmitPod("p1", "acme", 0, 1, 1000, 1000, 1024)),
            cmd(3, T0 + 2 * HOUR_MS, SetPolicy("first-fit")),  # watermark passes T0 + 1h + 5 min: hour 0 sealed
            V1Command("u-4", "c1", T0 + 30 * MINUTE, Release("p1")),  # late: the pod really stopped at :30
        ]
    )
    project(engine, events[:3])
    sealed_before = usage_by_hour(engine, models.tenant_usage)
    assert sealed_before[("acme", T0)] == 1000 * 50 * MINUTE  # charged to the end of the hour at sealing
    project(engine, events)
    with engine.connect() as conn:
        hour0 = conn.execute(select(models.usage_hours).where(models.usage_hours.c.hour == T0)).one()
        row0 = conn.execute(select(models.tenant_usage).where(models.tenant_usage.c.hour == T0)).one()
    assert hour0.status == "sealed" and row0.status == "sealed"
    assert row0.gpu_milli_ms == sealed_before[("acme", T0)]
    assert usage_by_hour(engine, models.usage_adjustments) == {("acme", T0): -1000 * 30 * MINUTE}
    assert usage_by_hour(engine, models.tenant_usage).get(("acme", T0 + HOUR_MS), 0) == 0


def test_a_late_command_of_todays_contract_is_charged_up_to_the_clock(engine: Engine) -> None:
    """Folded at the partition's clock, a late release ends the usage then: no adjustment, no time travel."""
    events = workload.fold(
        [
            cmd(1, T0, AddNode("n1", 64_000, 65_536, "A10", 8)),
            cmd(2, T0 + 10 * MINUTE, SubmitPod("p1", "acme", 0, 1, 1000, 1000, 1024)),
            cmd(3, T0 + 2 * HOUR_MS, SetPolicy("first-fit")),
            cmd(4, T0 + 30 * MINUTE, Release("p1")),
        ]
    )
    assert events[-1].occurred_at == T0 + 2 * HOUR_MS
    project(engine, events)
    assert usage_by_hour(engine, models.usage_adjustments) == {}
    charged = usage_by_hour(engine, models.tenant_usage)
    assert charged[("acme", T0)] == 1000 * 50 * MINUTE and charged[("acme", T0 + HOUR_MS)] == 1000 * HOUR_MS


def test_sealing_an_hour_twice_seals_it_once(engine: Engine) -> None:
    """The conditional update seals an open hour, and a second seal of the same hour does nothing."""
    with engine.begin() as conn:
        conn.execute(models.usage_hours.insert(), {"cluster": "c1", "hour": T0, "status": "open"})
        conn.execute(
            models.tenant_usage.insert(),
            {"cluster": "c1", "tenant": "acme", "hour": T0, "gpu_milli_ms": 5, "status": "open"},
        )
        assert seal_hour(conn, "c1", T0, T0 + HOUR_MS) is True
        assert seal_hour(conn, "c1", T0, T0 + 2 * HOUR_MS) is False
        hour = conn.execute(select(models.usage_hours)).one()
        usage = conn.execute(select(models.tenant_usage)).one()
    assert (hour.status, hour.sealed_watermark, usage.status) == ("sealed", T0 + HOUR_MS, "sealed")
