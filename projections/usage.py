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

No work or memory grows with a gap in event time (a far-future ``issued_at`` in an
old log, a pod started decades late): an hour gets a row only when something was
credited to it, and a run of more than :data:`SPAN_HOURS` whole hours at one rate
is a single span row (``tenant_usage_spans``, ``usage_adjustment_spans``). A credit
is therefore at most a few rows whatever its length: a partial first hour, a span
(or up to a day of hours), a partial last hour. Event times are clamped into the
contract's range (``schemas.limits``), so spans stay within 64-bit sums; a time
past the range (the rejection of a far-future command, an old log's event) never
moves the watermark, and usage at such a time counts at the cluster's watermark.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, update

from projections import models
from projections.dialect import upsert_add, upsert_ignore, upsert_replace
from schemas.limits import MAX_ISSUED_AT, MIN_ISSUED_AT

Write = Callable[[Connection], None]
"""A statement of a batch with its rows built, waiting for the batch's transaction."""

HOUR_MS = 3_600_000
DEFAULT_LATENESS_MS = 5 * 60_000
MAX_LATENESS_MS = 7 * 24 * HOUR_MS
"""The largest lateness allowance: it bounds how many hours can be open (and written one by one) at a time."""
SPAN_HOURS = 24
"""A run of more whole hours than this at one rate is written as one span row instead of a row per hour."""
_CHUNK = 500  # hours per IN (...) list


def usage_time(t: int) -> int:
    """An event time clamped into the contract's range (only logs written before the limits hold others)."""
    return min(max(t, MIN_ISSUED_AT), MAX_ISSUED_AT)


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


def pieces(start: int, end: int) -> Iterator[tuple[int, int, int]]:
    """[start, end) as (first hour, number of hours, milliseconds in each): at most three pieces.

    A partial first hour, the run of whole hours, a partial last hour (each present only if non-empty).
    """
    t = start
    if t % HOUR_MS and t < end:
        stop = min(end, hour_of(t) + HOUR_MS)
        yield hour_of(t), 1, stop - t
        t = stop
    whole = max(0, (end - t) // HOUR_MS)
    if whole:
        yield t, whole, HOUR_MS
        t += whole * HOUR_MS
    if t < end:
        yield t, 1, end - t


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
    # (cluster, tenant, first hour[, partition, sequence]) -> (hours, milli-ms in each hour)
    sealed_spans: dict[tuple[str, str, int], tuple[int, int]] = field(default_factory=dict)
    adjustment_spans: dict[tuple[str, str, int, int, int], tuple[int, int]] = field(default_factory=dict)
    hours: set[tuple[str, int]] = field(default_factory=set)
    sealed: list[tuple[str, int]] = field(default_factory=list)  # hours this batch sealed (once written)
    seals: list[Write] = field(default_factory=list)  # the sealing statements, in order, until planned

    def __post_init__(self) -> None:
        if not 0 <= self.lateness_ms <= MAX_LATENESS_MS:
            raise ValueError(f"lateness must be between 0 and {MAX_LATENESS_MS} ms (7 days), got {self.lateness_ms}")

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

    def carry(self, previous: UsageLedger, clusters: set[str]) -> None:
        """Take over the rates and clocks of ``clusters`` from the previous batch's ledger (as it left them)."""
        self.rates.update((key, rate) for key, rate in previous.rates.items() if key[0] in clusters)
        self.clocks.update((cluster, clock) for cluster, clock in previous.clocks.items() if cluster in clusters)

    def observe(self, cluster: str, t: int, position: tuple[int, int]) -> None:
        """Advance the cluster's watermark to event time ``t``, sealing every hour it leaves behind."""
        t = usage_time(t)
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
            self._seal(cluster, clock, until, position)

    def start(self, cluster: str, tenant: str, t: int, milli: int, position: tuple[int, int]) -> None:
        """A pod of the tenant holding ``milli`` GPU milli started running at ``t``."""
        self._change(cluster, tenant, t, milli, position)

    def stop(self, cluster: str, tenant: str, t: int, milli: int, position: tuple[int, int]) -> None:
        """A pod of the tenant holding ``milli`` GPU milli stopped running at ``t``."""
        self._change(cluster, tenant, t, -milli, position)

    def _change(self, cluster: str, tenant: str, t: int, delta: int, position: tuple[int, int]) -> None:
        if delta == 0:
            return
        if not MIN_ISSUED_AT <= t <= MAX_ISSUED_AT:  # an old log's out-of-range time: the cluster's time now
            clock = self.clocks.get(cluster)
            t = clock.watermark if clock is not None else usage_time(t)
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

    def _credit(
        self,
        cluster: str,
        tenant: str,
        start: int,
        end: int,
        milli: int,
        position: tuple[int, int],
        *,
        sealing: bool = False,
    ) -> None:
        """Credit ``milli`` over [start, end): sealed hours as adjustments, open ones as credits.

        At most a few entries whatever the length: a run of more than SPAN_HOURS whole sealed hours is one
        adjustment span, and (while ``sealing``, when the whole run is about to be sealed) one usage span.
        Outside sealing the open hours lie between the sealed point and the watermark, at most
        lateness + 1 h, so writing them one by one stays bounded.
        """
        if milli == 0 or end <= start:
            return
        sealed_until = self.clocks[cluster].sealed_until  # hour-aligned
        hour = start - start % HOUR_MS
        if hour >= sealed_until and end <= hour + HOUR_MS:  # the usual case: inside one open hour
            key = (cluster, tenant, hour)
            self.open_credits[key] = self.open_credits.get(key, 0) + milli * (end - start)
            self.hours.add((cluster, hour))
            return
        for first, count, ms in pieces(start, end):
            amount = milli * ms
            if first < sealed_until:
                late = min(count, (sealed_until - first) // HOUR_MS)
                self._adjust(cluster, tenant, first, late, amount, position)
                first, count = first + late * HOUR_MS, count - late
            if not count:
                continue
            if sealing and count > SPAN_HOURS:
                span = (cluster, tenant, first)
                if span in self.sealed_spans:
                    raise ValueError(f"usage span {span} credited twice")  # never: each rate moves past it
                self.sealed_spans[span] = (count, amount)
                continue
            for hour in range(first, first + count * HOUR_MS, HOUR_MS):
                key3 = (cluster, tenant, hour)
                self.open_credits[key3] = self.open_credits.get(key3, 0) + amount
                self.hours.add((cluster, hour))

    def _adjust(
        self, cluster: str, tenant: str, first: int, count: int, amount: int, position: tuple[int, int]
    ) -> None:
        """``amount`` in each of ``count`` sealed hours from ``first``, keyed by the event that revealed it."""
        if count > SPAN_HOURS:
            key = (cluster, tenant, first, position[0], position[1])
            hours, previous = self.adjustment_spans.get(key, (count, 0))
            if hours != count:
                raise ValueError(f"adjustment span {key} credited with {hours} and {count} hours")
            self.adjustment_spans[key] = (count, previous + amount)
            return
        for hour in range(first, first + count * HOUR_MS, HOUR_MS):
            key5 = (cluster, tenant, hour, position[0], position[1])
            self.adjustments[key5] = self.adjustments.get(key5, 0) + amount

    # ---------------------------------------------------------------- sealing

    def _seal(self, cluster: str, clock: Clock, until: int, position: tuple[int, int]) -> None:
        """Seal the hours [sealed_until, until): credit every rate up to ``until``, then close them.

        The statements are queued (:attr:`seals`), not run: they go out with the batch's other
        writes, in the same order, so applying a batch never touches the database.
        """
        start = clock.sealed_until
        for (rate_cluster, tenant), rate in sorted(self.rates.items()):
            if rate_cluster == cluster and rate.since < until and rate.running_milli:
                self._credit(cluster, tenant, rate.since, until, rate.running_milli, position, sealing=True)
                rate.since = until
                self.dirty_rates.add((cluster, tenant))
        credits = {k: v for k, v in self.open_credits.items() if k[0] == cluster and k[2] < until}
        for key in credits:
            del self.open_credits[key]
        self.hours = {(c, h) for c, h in self.hours if c != cluster or h >= until}
        hours = sorted({(c, h) for c, _, h in credits})  # hours with usage only: a gap costs nothing
        watermark = clock.watermark

        def seal(conn: Connection) -> None:
            _write_hours(conn, hours)
            _write_credits(conn, credits)
            self.sealed.extend((cluster, hour) for hour in seal_hours(conn, cluster, start, until, watermark))

        self.seals.append(seal)
        clock.sealed_until = until
        self.dirty_clocks.add(cluster)

    def flush(self, conn: Connection) -> None:
        """Write the queued seals, buffered credits, adjustments, rates and clocks (inside the batch transaction)."""
        for write in self.plan():
            write(conn)

    def plan(self) -> list[Write]:
        """The batch's usage statements, in order, with their rows built now; the buffers start over.

        The rows are plain values, so the rates and clocks may go on changing (the next
        batch, pipelined) while these statements wait to be written.
        """
        writes = self.seals
        self.seals = []
        hours = sorted(self.hours)
        credits = dict(self.open_credits)
        writes.append(lambda conn: _write_hours(conn, hours))
        writes.append(lambda conn: _write_credits(conn, credits))
        if self.adjustments:
            adjustments = [
                {"cluster": c, "tenant": t, "hour": h, "partition": p, "sequence": s, "gpu_milli_ms": amount}
                for (c, t, h, p, s), amount in sorted(self.adjustments.items())
            ]
            writes.append(
                lambda conn: _execute(conn, upsert_add(conn, models.usage_adjustments, "gpu_milli_ms"), adjustments)
            )
        if self.sealed_spans:
            spans = [
                {"cluster": c, "tenant": t, "start_hour": h, "hours": n, "gpu_milli_ms_per_hour": amount}
                for (c, t, h), (n, amount) in sorted(self.sealed_spans.items())
            ]
            writes.append(lambda conn: _execute(conn, models.tenant_usage_spans.insert(), spans))
        if self.adjustment_spans:
            adjustment_spans = [
                {"cluster": c, "tenant": t, "start_hour": h, "partition": p, "sequence": q, "hours": n,
                 "gpu_milli_ms_per_hour": amount}
                for (c, t, h, p, q), (n, amount) in sorted(self.adjustment_spans.items())
            ]  # fmt: skip
            writes.append(lambda conn: _execute(conn, models.usage_adjustment_spans.insert(), adjustment_spans))
        if self.dirty_rates:
            rates = [
                {"cluster": c, "tenant": t, "running_milli": self.rates[(c, t)].running_milli,
                 "since": self.rates[(c, t)].since}
                for c, t in sorted(self.dirty_rates)
            ]  # fmt: skip
            writes.append(lambda conn: _execute(conn, upsert_replace(conn, models.tenant_rates), rates))
        if self.dirty_clocks:
            clocks = [
                {"cluster": c, "watermark": self.clocks[c].watermark, "sealed_until": self.clocks[c].sealed_until}
                for c in sorted(self.dirty_clocks)
            ]
            writes.append(lambda conn: _execute(conn, upsert_replace(conn, models.usage_clocks), clocks))
        self.hours.clear()
        self.open_credits.clear()
        self.adjustments.clear()
        self.sealed_spans.clear()
        self.adjustment_spans.clear()
        self.dirty_rates.clear()
        self.dirty_clocks.clear()
        return writes


def _execute(conn: Connection, statement: Any, rows: list[dict[str, Any]]) -> None:
    conn.execute(statement, rows)


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
    usage = models.tenant_usage
    ordered = sorted(sealed)
    for i in range(0, len(ordered), _CHUNK):  # an IN list per chunk: SQLite caps the number of variables
        conn.execute(
            update(usage)
            .where(usage.c.cluster == cluster, usage.c.hour.in_(ordered[i : i + _CHUNK]), usage.c.status == "open")
            .values(status="sealed")
        )
    return ordered


def seal_hour(conn: Connection, cluster: str, hour: int, watermark: int) -> bool:
    """Seal one hour of a cluster; True if this call sealed it, False if it was sealed already."""
    return bool(seal_hours(conn, cluster, hour, hour + HOUR_MS, watermark))
