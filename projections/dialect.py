"""Upserts that work on PostgreSQL and SQLite alike (both speak ``INSERT ... ON CONFLICT``)."""

from __future__ import annotations

import json
from operator import itemgetter
from typing import Any

from sqlalchemy import Column, Connection, Table, any_, literal
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY


def _insert(conn: Connection, table: Table) -> Any:
    if conn.dialect.name == "postgresql":
        return postgresql.insert(table)
    if conn.dialect.name == "sqlite":
        return sqlite.insert(table)
    raise ValueError(f"unsupported database {conn.dialect.name!r}: use PostgreSQL or SQLite")


def _keys(table: Table) -> list[str]:
    return [column.name for column in table.primary_key.columns]


def in_list(conn: Connection, column: Column[Any], values: list[Any]) -> Any:
    """``column IN values``: one array parameter on PostgreSQL (cheap to plan), a bound list elsewhere."""
    if conn.dialect.name == "postgresql":
        return column == any_(literal(values, ARRAY(column.type)))
    return column.in_(values)


def upsert_ignore(conn: Connection, table: Table) -> Any:
    """Insert rows whose key is new; leave existing rows alone."""
    return _insert(conn, table).on_conflict_do_nothing(index_elements=_keys(table))


def upsert_replace(conn: Connection, table: Table) -> Any:
    """Insert rows, or overwrite every non-key column of the existing row."""
    stmt = _insert(conn, table)
    keys = set(_keys(table))
    values = {column.name: stmt.excluded[column.name] for column in table.columns if column.name not in keys}
    return stmt.on_conflict_do_update(index_elements=list(keys), set_=values)


def upsert_add(conn: Connection, table: Table, column: str, *, only_open: bool = False) -> Any:
    """Insert rows, or add the new row's ``column`` to the existing one.

    With ``only_open`` the existing row changes only while its status is 'open':
    a sealed row is never modified, whatever a caller does.
    """
    stmt = _insert(conn, table)
    where = table.c.status == "open" if only_open else None
    return stmt.on_conflict_do_update(
        index_elements=_keys(table),
        set_={column: table.c[column] + stmt.excluded[column]},
        where=where,
    )


# ------------------------------------------------------------------ bulk writes
#
# SQLAlchemy's executemany is fine on SQLite (the C driver loops) but costs a
# round of Python per row on psycopg. On PostgreSQL, large batches go through
# COPY into a session-local temporary table, then one INSERT ... SELECT merges
# them: one statement per table per batch, whatever the batch size.

_COPY_THRESHOLD = 64


def target_name(conn: Connection, table: Table) -> str:
    """The table's quoted name for raw SQL, in the schema the connection's schema_translate_map gives it."""
    schema = (conn.get_execution_options().get("schema_translate_map") or {}).get(table.schema, table.schema)
    return f'"{schema}"."{table.name}"' if schema else f'"{table.name}"'


def bulk_insert(conn: Connection, table: Table, rows: list[dict[str, Any]]) -> None:
    """Insert rows (no conflicts expected); COPY on PostgreSQL."""
    if not rows:
        return
    if conn.dialect.name != "postgresql" or len(rows) < _COPY_THRESHOLD:
        conn.execute(table.insert(), rows)
        return
    with conn.connection.driver_connection.cursor() as cursor:  # type: ignore[union-attr]
        _copy(cursor, target_name(conn, table), table, rows, _copy_types(conn, table))


_TYPES: dict[Table, list[str]] = {}


def _copy_types(conn: Connection, table: Table) -> list[str]:
    """The PostgreSQL type names of the table's columns, for a binary COPY (``varchar``, ``bigint``, ``jsonb``)."""
    types = _TYPES.get(table)
    if types is None:
        types = _TYPES[table] = [
            column.type.compile(dialect=conn.dialect).split("(")[0].lower() for column in table.columns
        ]
    return types


def append_rows(conn: Connection, table: Table, rows: list[tuple[Any, ...]]) -> None:
    """Insert rows given as tuples in the table's column order (no conflicts expected, no JSON columns).

    On PostgreSQL a binary COPY: no dict per row, and no text escaping of bytea on
    either side (the audit log's frames). Elsewhere an executemany.
    """
    if not rows:
        return
    names = [column.name for column in table.columns]
    if conn.dialect.name != "postgresql" or len(rows) < _COPY_THRESHOLD:
        conn.execute(table.insert(), [dict(zip(names, row, strict=True)) for row in rows])
        return
    column_list = ", ".join(f'"{name}"' for name in names)
    statement = f"COPY {target_name(conn, table)} ({column_list}) FROM STDIN (FORMAT BINARY)"
    cursor = conn.connection.driver_connection.cursor()  # type: ignore[union-attr]
    with cursor, cursor.copy(statement) as copy:
        copy.set_types(_copy_types(conn, table))
        write = copy.write_row
        for row in rows:
            write(row)


class _JsonbValue:
    """Never instantiated: the Python type the fast jsonb dumper is registered for (COPY picks dumpers by oid)."""


_EMPTY_JSONB = b"\x01[]"
_encode_json = json.JSONEncoder().encode
_JSONB_DUMPER: Any = None


def _jsonb_dumper() -> Any:
    """psycopg's binary jsonb dumper in one call per value instead of three: jsonb's version byte, then
    the value as ``json.dumps`` writes it (the same bytes psycopg's own dumper writes)."""
    global _JSONB_DUMPER
    if _JSONB_DUMPER is None:
        from psycopg.types.json import JsonbBinaryDumper  # psycopg is optional (the postgres extra)

        class FastJsonbDumper(JsonbBinaryDumper):
            def dump(self, obj: Any) -> bytes:
                if obj == []:
                    return _EMPTY_JSONB
                return b"\x01" + _encode_json(obj).encode()

        _JSONB_DUMPER = FastJsonbDumper
    return _JSONB_DUMPER


def _copy(cursor: Any, target: str, table: Table, rows: list[dict[str, Any]], types: list[str]) -> str:
    """Binary COPY of rows into ``target`` (a table name, quoted); returns the column list used.

    Binary, not text: integers go as 8 bytes instead of digits the server parses, and
    nothing is escaped; a JSON value goes as its text behind jsonb's version byte
    (:func:`_jsonb_dumper`).
    """
    names = [column.name for column in table.columns]
    column_list = ", ".join(f'"{name}"' for name in names)
    row_of = itemgetter(*names)
    cursor.adapters.register_dumper(_JsonbValue, _jsonb_dumper())  # set_types("jsonb") finds it by oid
    with cursor.copy(f"COPY {target} ({column_list}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(types)
        write = copy.write_row
        for row in rows:
            write(row_of(row))
    return column_list


def bulk_upsert_replace(conn: Connection, table: Table, rows: list[dict[str, Any]]) -> None:
    """Insert rows or overwrite the existing ones (keys must be unique within ``rows``).

    On PostgreSQL: COPY into a session-local temporary twin of the table, one
    ``INSERT ... SELECT ... ON CONFLICT DO UPDATE``, then truncate the twin (all in
    the caller's transaction, so a rollback undoes all of it).
    """
    if not rows:
        return
    if conn.dialect.name != "postgresql" or len(rows) < _COPY_THRESHOLD:
        conn.execute(upsert_replace(conn, table), rows)
        return
    target = target_name(conn, table)
    temp = f'"_bulk_{table.name}"'
    keys = _keys(table)
    sets = ", ".join(f'"{c.name}" = EXCLUDED."{c.name}"' for c in table.columns if c.name not in keys)
    key_list = ", ".join(f'"{k}"' for k in keys)
    with conn.connection.driver_connection.cursor() as cursor:  # type: ignore[union-attr]
        cursor.execute(f"CREATE TEMP TABLE IF NOT EXISTS {temp} (LIKE {target})")
        column_list = _copy(cursor, temp, table, rows, _copy_types(conn, table))
        cursor.execute(
            f"INSERT INTO {target} ({column_list}) SELECT {column_list} FROM {temp} "
            f"ON CONFLICT ({key_list}) DO UPDATE SET {sets}"
        )
        cursor.execute(f"TRUNCATE {temp}")  # DELETE would leave dead rows: temp tables are never vacuumed
