"""Creating the projection tables: Alembic migrations for the live database, create_all for scratch ones."""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import Connection, Engine, inspect, text

from projections import models

MIGRATIONS = Path(__file__).resolve().parent / "migrations"


def alembic_config(connection: Connection | None = None):  # type: ignore[no-untyped-def]
    """An Alembic config pointing at projections/migrations (no alembic.ini needed)."""
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def migrate(engine: Engine, revision: str = "head") -> None:
    """Upgrade the database to ``revision`` with Alembic (``gpufold projections migrate``)."""
    from alembic import command

    with engine.begin() as conn:
        command.upgrade(alembic_config(conn), revision)


def ensure_schema(engine: Engine) -> None:
    """Make the tables exist: migrations on PostgreSQL, create_all on SQLite (the demo's scratch file)."""
    if engine.dialect.name == "postgresql":
        migrate(engine)
    else:
        models.Base.metadata.create_all(engine)


def create_fresh_schema(engine: Engine, schema: str) -> None:
    """A new, empty PostgreSQL schema holding every projection table (for rebuilds)."""
    with engine.begin() as conn:
        conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))
        conn.execute(text(f'CREATE SCHEMA "{schema}"'))
        models.Base.metadata.create_all(conn.execution_options(schema_translate_map={None: schema}))


def drop_schema(engine: Engine, schema: str) -> None:
    with engine.begin() as conn:
        conn.execute(text(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE'))


def has_tables(engine: Engine) -> bool:
    return inspect(engine).has_table(models.projection_offsets.name)
