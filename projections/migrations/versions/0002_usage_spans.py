"""usage spans: a run of whole sealed hours as one row, so a gap in event time costs one row per tenant

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "tenant_usage_spans",
        sa.Column("cluster", sa.String(length=253), nullable=False),
        sa.Column("tenant", sa.String(length=253), nullable=False),
        sa.Column("start_hour", sa.BigInteger(), nullable=False),
        sa.Column("hours", sa.BigInteger(), nullable=False),
        sa.Column("gpu_milli_ms_per_hour", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("cluster", "tenant", "start_hour", name=op.f("pk_tenant_usage_spans")),
    )
    op.create_table(
        "usage_adjustment_spans",
        sa.Column("cluster", sa.String(length=253), nullable=False),
        sa.Column("tenant", sa.String(length=253), nullable=False),
        sa.Column("start_hour", sa.BigInteger(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("sequence", sa.BigInteger(), nullable=False),
        sa.Column("hours", sa.BigInteger(), nullable=False),
        sa.Column("gpu_milli_ms_per_hour", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(
            "cluster", "tenant", "start_hour", "partition", "sequence", name=op.f("pk_usage_adjustment_spans")
        ),
    )


def downgrade() -> None:
    op.drop_table("usage_adjustment_spans")
    op.drop_table("tenant_usage_spans")
