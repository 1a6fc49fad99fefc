"""Audit: re-project the events from offset 0 into a fresh schema and prove it equals the live one.

The live tables are read in one REPEATABLE READ snapshot: their projection
offsets (how far the live projector got) and a content hash per table. The
rebuild projects exactly up to those offsets into a new PostgreSQL schema (or a
new SQLite file), hashes it the same way, and compares table by table. Equal
hashes mean the live projection is what the events say, no row lost or doubled.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import Boolean, Connection, Engine, create_engine, select

from projections import models
from projections.projector import Projector
from projections.runner import run
from projections.schema import create_fresh_schema, drop_schema
from projections.sources import EventSource
from projections.usage import DEFAULT_LATENESS_MS


def _canonical(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_canonical(v) for v in value]
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    return value


def table_hash(conn: Connection, table: Any) -> tuple[str, int]:
    """(sha256 of the rows in primary-key order, row count); equal contents give equal hashes on any backend."""
    digest = hashlib.sha256()
    booleans = [isinstance(column.type, Boolean) for column in table.columns]
    count = 0
    result = conn.execution_options(yield_per=5_000).execute(select(table).order_by(*table.primary_key.columns))
    for row in result:
        values = [bool(v) if b and v is not None else _canonical(v) for v, b in zip(row, booleans, strict=True)]
        digest.update(json.dumps(values, sort_keys=True, separators=(",", ":")).encode())
        digest.update(b"\n")
        count += 1
    return digest.hexdigest(), count


def content_hashes(conn: Connection) -> dict[str, tuple[str, int]]:
    """Per-table (hash, rows) of every projection table."""
    return {table.name: table_hash(conn, table) for table in models.TABLES}


def live_snapshot(engine: Engine, source: str) -> tuple[dict[int, int], dict[str, tuple[str, int]]]:
    """The live offsets of ``source`` and the table hashes, read in one consistent snapshot."""
    options: dict[str, Any] = {}
    if engine.dialect.name == "postgresql":
        options["isolation_level"] = "REPEATABLE READ"
    with engine.connect().execution_options(**options) as conn, conn.begin():
        table = models.projection_offsets
        rows = conn.execute(select(table).where(table.c.source == source))
        offsets = {row.partition: row.next_offset for row in rows}
        return offsets, content_hashes(conn)


@dataclass
class RebuildReport:
    equal: bool
    offsets: dict[int, int]
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: int = 0
    seconds: float = 0.0
    target: str = ""

    def as_json(self) -> dict[str, Any]:
        return {
            "equal": self.equal,
            "offsets": {str(p): o for p, o in sorted(self.offsets.items())},
            "events": self.events,
            "seconds": round(self.seconds, 3),
            "target": self.target,
            "tables": self.tables,
        }


def rebuild(
    live: Engine,
    source_name: str,
    make_source: Callable[[dict[int, int]], EventSource],
    *,
    schema: str = "gpufold_rebuild",
    keep: bool = False,
    lateness_ms: int = DEFAULT_LATENESS_MS,
    batch_size: int = 5_000,
) -> RebuildReport:
    """Re-project ``source`` up to the live offsets into a fresh schema and compare per-table hashes.

    ``make_source(until)`` opens the event source bounded by ``until`` (partition -> end offset).
    On SQLite the fresh "schema" is a new database file in a temporary directory.
    """
    offsets, live_hashes = live_snapshot(live, source_name)
    tmpdir: tempfile.TemporaryDirectory[str] | None = None
    if live.dialect.name == "postgresql":
        create_fresh_schema(live, schema)
        target_engine, target_schema, target = live, schema, f"schema {schema}"
    else:
        tmpdir = tempfile.TemporaryDirectory(prefix="gpufold-rebuild-")
        path = Path(tmpdir.name) / "rebuild.sqlite"
        target_engine = create_engine(f"sqlite:///{path}")
        models.Base.metadata.create_all(target_engine)
        target_schema, target = None, str(path)
    try:
        source = make_source(offsets)
        try:
            projector = Projector(target_engine, source_name, lateness_ms=lateness_ms, schema=target_schema)
            stats = run(projector, source, batch_size=batch_size, poll_timeout=1.0, stop_when_idle=True)
        finally:
            source.close()
        with target_engine.connect() as conn:
            if target_schema:
                conn = conn.execution_options(schema_translate_map={None: target_schema})
            rebuilt = content_hashes(conn)
    finally:
        if target_schema and not keep:
            drop_schema(live, target_schema)
        if tmpdir is not None:
            if target_engine is not live:
                target_engine.dispose()
            tmpdir.cleanup()
    tables = {}
    for name, (digest, rows) in live_hashes.items():
        other_digest, other_rows = rebuilt[name]
        tables[name] = {"equal": digest == other_digest, "live_rows": rows, "rebuilt_rows": other_rows,
                        "live_sha256": digest, "rebuilt_sha256": other_digest}  # fmt: skip
    equal = all(item["equal"] for item in tables.values())
    return RebuildReport(equal, offsets, tables, stats.events, stats.seconds, target)
