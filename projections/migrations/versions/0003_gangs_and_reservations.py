"""gangs and reservations: the jobs that span nodes, and the nodes held for the head of a queue;
audit events by type (preemptions and migrations of a cluster)

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def _json() -> sa.types.TypeEngine:
    return sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "gangs",
        sa.Column("cluster", sa.String(length=253), nullable=False),
        sa.Column("gang_id", sa.String(length=253), nullable=False),
        sa.Column("tenant", sa.String(length=253), nullable=False),
        sa.Column("priority", sa.Integer(), nullable=False),
        sa.Column("arrival", sa.BigInteger(), nullable=False),
        sa.Column("members", _json(), nullable=False),
        sa.Column("min_members", sa.Integer(), nullable=False),
        sa.Column("topology_required", sa.String(length=253), nullable=True),
        sa.Column("topology_preferred", sa.String(length=253), nullable=True),
        sa.Column("time_limit_ms", sa.BigInteger(), nullable=True),
        sa.Column("timeout_ms", sa.BigInteger(), nullable=True),
        sa.Column("depends_on", _json(), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("waiting_for", _json(), nullable=False),
        sa.Column("reasons", _json(), nullable=False),
        sa.Column("placed", _json(), nullable=False),
        sa.Column("topology_key", sa.String(length=253), nullable=True),
        sa.Column("domain", sa.String(length=253), nullable=True),
        sa.Column("submitted_at", sa.BigInteger(), nullable=False),
        sa.Column("queued_at", sa.BigInteger(), nullable=True),
        sa.Column("started_at", sa.BigInteger(), nullable=True),
        sa.Column("ended_at", sa.BigInteger(), nullable=True),
        sa.Column("end_reason", sa.String(length=64), nullable=True),
        sa.Column("ended_ok", sa.Boolean(), nullable=True),
        sa.Column("updated_sequence", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("cluster", "gang_id", name=op.f("pk_gangs")),
    )
    op.create_index("ix_gangs_cluster_status", "gangs", ["cluster", "status"], unique=False)
    op.create_index("ix_audit_events_type", "audit_events", ["cluster", "type"], unique=False)
    op.create_table(
        "reservations",
        sa.Column("cluster", sa.String(length=253), nullable=False),
        sa.Column("holder_id", sa.String(length=253), nullable=False),
        sa.Column("holder_kind", sa.String(length=8), nullable=False),
        sa.Column("nodes", _json(), nullable=False),
        sa.Column("expected_start", sa.BigInteger(), nullable=True),
        sa.Column("made_at", sa.BigInteger(), nullable=False),
        sa.Column("message", sa.String(length=1000), nullable=False),
        sa.Column("updated_sequence", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("cluster", name=op.f("pk_reservations")),
    )


def downgrade() -> None:
    op.drop_table("reservations")
    op.drop_index("ix_audit_events_type", table_name="audit_events")
    op.drop_index("ix_gangs_cluster_status", table_name="gangs")
    op.drop_table("gangs")
