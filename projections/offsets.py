"""The projector's offsets: per (source, partition), the next source offset to read and the next event sequence
to apply, in ``projection_offsets``, written in the same transaction as the rows they account for."""

from __future__ import annotations

from sqlalchemy import Connection, and_, select

from projections import models
from projections.dialect import upsert_ignore


def load_offsets(conn: Connection, source: str) -> dict[int, tuple[int, int]]:
    """partition -> (next_offset, next_sequence) for a source."""
    table = models.projection_offsets
    rows = conn.execute(select(table).where(table.c.source == source))
    return {row.partition: (row.next_offset, row.next_sequence) for row in rows}


def lock_offsets(conn: Connection, source: str, partitions: list[int]) -> dict[int, tuple[int, int]]:
    """Like :func:`load_offsets` for these partitions (rows created at 0 if missing), locked until the
    transaction ends (``SELECT ... FOR UPDATE`` on PostgreSQL)."""
    table = models.projection_offsets
    conn.execute(
        upsert_ignore(conn, table),
        [{"source": source, "partition": p, "next_offset": 0, "next_sequence": 0} for p in partitions],
    )
    rows = conn.execute(
        select(table)
        .where(and_(table.c.source == source, table.c.partition.in_(partitions)))
        .order_by(table.c.partition)
        .with_for_update()
    )
    return {row.partition: (row.next_offset, row.next_sequence) for row in rows}
