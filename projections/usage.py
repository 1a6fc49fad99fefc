"""Usage accounting: GPU milli-milliseconds per tenant per hour of event time, and hour sealing.

Each (cluster, tenant) has a rate: the GPU milli its running pods hold, and
``since``, the event time up to which that rate is credited. A pod starting or
stopping at event time ``t`` first credits ``rate x (t - since)`` and then
changes the rate; an event that arrives late (``t < since``) credits the
difference directly (``+/- milli x (since - t)``), so every pod is charged
exactly ``milli x (stop - start)`` whatever order its events come in.

An hour ``[S, E)`` is sealed once the cluster's event-time watermark (the
largest ``occurred_at`` seen) reaches ``E + lateness``: first every rate is
credited up to ``E``, then the hour is closed with a conditional
``UPDATE ... WHERE status = 'open'`` so that two racing sealers seal it once.
A credit to a sealed hour never touches its row: it becomes an adjustment
row keyed by the event that revealed it.

Sealing is decided per event, never per batch, so the tables do not depend on
how the events were batched (a rebuild equals the live projection).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from sqlalchemy import Connection, update

from projections import models
from projections.dialect import upsert_add, upsert_ignore, upsert_replace

HOUR_MS = 3_600_000
DEFAULT_LATENESS_MS = 5 * 60_000


def hour_of(t: int) -> int:
    """The start of the hour holding epoch-millisecond ``t``."""
    return t - t % HOUR_MS


def split_hours(start: int, end: int) -> Iterator[tuple[int, int]]:
    """(hour, milliseconds of [start, end) inside it), in order; nothing if end <= start."""
    t = start
    while t < end:
        hour = hour_of(t)
        stop = min(end, hour + HOUR_MS)
        yield hour, stop - t
        t = stop


@dataclass(slots=True)
class Rate:
    running_milli: int
    since: int


@dataclass(slots=True)
class Clock:
    watermark: int
    sealed_until: int


@dataclass
class UsageLedger:
    """The usage side of one batch: rates and clocks loaded once, credits buffered until flush."""

    lateness_ms: int = DEFAULT_LATENESS_MS
    rates: dict[tuple[str, str], Rate] = field(default_factory=dict)
    clocks: dict[str, Clock] = field(default_factory=dict)
    dirty_rates: set[tuple[str, str]] = field(default_factory=set)
    dirty_clocks: set[str] = field(default_factory=set)
    open_credits: dict[tuple[str, str, int], int] = field(default_factory=dict)
    adjustments: dict[tuple[str, str, int, int, int], int] = field(default_factory=dict)
    hours: set[tuple[str, int]] = field(default_factory=set)
    sealed: list[tuple[str, int]] = field(default_factory=list)  # hours this batch sealed

    # ---------------------------------------------------------------- loading

    def load(self, conn: Connection, clusters: set[str]) -> None:
        """Load the rates and clocks of the clusters in a batch (a handful of rows per cluster)."""
        if not clusters:
            return
        names = sorted(clusters)
        for row in conn.execute(models.tenant_rates.select().where(models.tenant_rates.c.cluster.in_(names))):
            self.rates[(row.cluster, row.tenant)] = Rate(row.running_milli, row.since)
        for row in conn.execute(models.usage_clocks.select().where(models.usage_clocks.c.cluster.in_(names))):
            self.clocks[row.cluster] = Clock(row.watermark, row.sealed_until)

    # ---------------------------------------------------------------- events

    def observe(self, conn: Connection, cluster: str, t: int, position: tuple[int, int]) -> None:
        """Advance the cluster's watermark to event time ``t``, sealing every hour it leaves behind."""
        clock = self.clocks.get(cluster)
        if clock is None:
            clock = self.clocks[cluster] = Clock(t, hour_of(t))
            self.dirty_clocks.add(cluster)
        if t <= clock.watermark:
            return
        clock.watermark = t
        self.dirty_clocks.add(cluster)
        # Every hour ending at or before watermark - lateness is sealed, all at once.
        until = hour_of(clock.watermark - self.lateness_ms)
        if until > clock.sealed_until:
            self._seal(conn, cluster, clock, until, position)

    def start(self, cluster: str, tenant: str, t: int, milli: int, position: tuple[int, int]) -> None:
        """A pod of the tenant holding ``milli`` GPU milli started running at ``t``."""
        self._change(cluster, tenant, t, milli, position)

    def stop(self, cluster: str, tenant: str, t: int, milli: int, position: tuple[int, int]) -> None:
        """A pod of the tenant holding ``milli`` GPU milli stopped running at ``t``."""
        self._change(cluster, tenant, t, -milli, position)

    def _change(self, cluster: str, tenant: str, t: int, delta: int, position: tuple[int, int]) -> None:
        if delta == 0:
            return
        key = (cluster, tenant)
        rate = self.rates.get(key)
        if rate is None:
            rate = self.rates[key] = Rate(0, t)
        if t >= rate.since:
            self._credit(cluster, tenant, rate.since, t, rate.running_milli, position)
            rate.since = t
        else:  # a late event: correct what was credited since t
            self._credit(cluster, tenant, t, rate.since, delta, position)
        rate.running_milli += delta
        self.dirty_rates.add(key)

    def _credit(self, cluster: str, tenant: str, start: int, end: int, milli: int, position: tuple[int, int]) -> None:
        if milli == 0 or end <= start:
            return
        clock = self.clocks[cluster]
        for hour, ms in split_hours(start, end):
            amount = milli * ms
            if hour < clock.sealed_until:
                key5 = (cluster, tenant, hour, position[0], position[1])
                self.adjustments[key5] = self.adjustments.get(key5, 0) + amount
            else:
                key3 = (cluster, tenant, hour)
                self.open_credits[key3] = self.open_credits.get(key3, 0) + amount
                self.hours.add((cluster, hour))

    # ---------------------------------------------------------------- sealing

    def _seal(self, conn: Connection, cluster: str, clock: Clock, until: int, position: tuple[int, int]) -> None:
        """Seal the hours [sealed_until, until): credit every rate up to ``until``, then close them."""
        start = clock.sealed_until
        for (rate_cluster, tenant), rate in sorted(self.rates.items()):
            if rate_cluster == cluster and rate.since < until and rate.running_milli:
                self._credit(cluster, tenant, rate.since, until, rate.running_milli, position)
                rate.since = until
                self.dirty_rates.add((cluster, tenant))
        credits = {k: v for k, v in self.open_credits.items() if k[0] == cluster and k[2] < until}
        for key in credits:
            del self.open_credits[key]
        self.hours = {(c, h) for c, h in self.hours if c != cluster or h >= until}
        _write_hours(conn, [(cluster, hour) for hour in range(start, until, HOUR_MS)])
        _write_credits(conn, credits)
        self.sealed.extend((cluster, hour) for hour in seal_hours(conn, cluster, start, until, clock.watermark))
        clock.sealed_until = until
        self.dirty_clocks.add(cluster)

    def flush(self, conn: Connection) -> None:
        """Write the buffered credits, adjustments, rates and clocks (inside the batch transaction)."""
        _write_hours(conn, sorted(self.hours))
        _write_credits(conn, self.open_credits)
        if self.adjustments:
            conn.execute(
                upsert_add(conn, models.usage_adjustments, "gpu_milli_ms"),
                [
                    {"cluster": c, "tenant": t, "hour": h, "partition": p, "sequence": s, "gpu_milli_ms": amount}
                    for (c, t, h, p, s), amount in sorted(self.adjustments.items())
                ],
            )
        if self.dirty_rates:
            rows = [
                {"cluster": c, "tenant": t, "running_milli": self.rates[(c, t)].running_milli,
                 "since": self.rates[(c, t)].since}
                for c, t in sorted(self.dirty_rates)
            ]  # fmt: skip
            conn.execute(upsert_replace(conn, models.tenant_rates), rows)
        if self.dirty_clocks:
            rows = [
                {"cluster": c, "watermark": self.clocks[c].watermark, "sealed_until": self.clocks[c].sealed_until}
                for c in sorted(self.dirty_clocks)
            ]
            conn.execute(upsert_replace(conn, models.usage_clocks), rows)
        self.hours.clear()
        self.open_credits.clear()
        self.adjustments.clear()
        self.dirty_rates.clear()
        self.dirty_clocks.clear()


def _write_hours(conn: Connection, hours: list[tuple[str, int]]) -> None:
    if hours:
        conn.execute(
            upsert_ignore(conn, models.usage_hours),
            [{"cluster": c, "hour": h, "status": "open", "sealed_watermark": None} for c, h in hours],
        )


def _write_credits(conn: Connection, credits: dict[tuple[str, str, int], int]) -> None:
    if credits:
        conn.execute(
            upsert_add(conn, models.tenant_usage, "gpu_milli_ms", only_open=True),
            [
                {"cluster": c, "tenant": t, "hour": h, "gpu_milli_ms": amount, "status": "open"}
                for (c, t, h), amount in sorted(credits.items())
            ],
        )


def seal_hours(conn: Connection, cluster: str, start: int, end: int, watermark: int) -> list[int]:
    """Seal a cluster's open hours in [start, end); returns the hours this call sealed.

    A conditional update (``WHERE status = 'open'``) takes each row's lock, so a
    concurrent sealer waits, then finds the hour sealed and skips it: every hour
    is sealed exactly once, and its usage rows with it.
    """
    hours = models.usage_hours
    sealed = (
        conn.execute(
            update(hours)
            .where(hours.c.cluster == cluster, hours.c.hour >= start, hours.c.hour < end, hours.c.status == "open")
            .values(status="sealed", sealed_watermark=watermark)
            .returning(hours.c.hour)
        )
        .scalars()
        .all()
    )
    if sealed:
        usage = models.tenant_usage
        conn.execute(
            update(usage)
            .where(usage.c.cluster == cluster, usage.c.hour.in_(sorted(sealed)), usage.c.status == "open")
            .values(status="sealed")
        )
    return sorted(sealed)


def seal_hour(conn: Connection, cluster: str, hour: int, watermark: int) -> bool:
    """Seal one hour of a cluster; True if this call sealed it, False if it was sealed already."""
    return bool(seal_hours(conn, cluster, hour, hour + HOUR_MS, watermark))
