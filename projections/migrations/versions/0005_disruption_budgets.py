"""disruption budgets: each budget as set, with the drain evictions it blocks (issue #25)

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def _json() -> sa.types.TypeEngine:
    return sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def upgrade() -> None:
    op.create_table(
        "disruption_budgets",
        sa.Column("cluster", sa.String(length=253), nullable=False),
        sa.Column("budget_id", sa.String(length=253), nullable=False),
        sa.Column("tenant", sa.String(length=253), nullable=True),
        sa.Column("gang_id", sa.String(length=253), nullable=True),
        sa.Column("label_selector", _json(), nullable=False),
        sa.Column("max_unavailable", sa.Integer(), nullable=False),
        sa.Column("set_at", sa.BigInteger(), nullable=False),
        sa.Column("blocked", _json(), nullable=False),
        sa.Column("updated_sequence", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("cluster", "budget_id", name=op.f("pk_disruption_budgets")),
    )


def downgrade() -> None:
    op.drop_table("disruption_budgets")
