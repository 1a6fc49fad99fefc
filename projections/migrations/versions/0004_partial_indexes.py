"""partial indexes: pods by status only where evicted, audit events by type only for disruptions

Every pod status change moved an entry of ix_pods_cluster_status, and every event projected added
one to ix_audit_events_type: ~3-4 us of PostgreSQL CPU per event each, for two lookups that read
only a few rows (evicted pods, disruption events). Partial indexes keep those lookups and drop the rest.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

EVICTED = "status = 'evicted'"
DISRUPTIONS = "type IN ('PodPreempted', 'PodMigrated', 'DefragmentationPlanned')"


def upgrade() -> None:
    op.drop_index("ix_pods_cluster_status", table_name="pods")
    op.create_index(
        "ix_pods_evicted",
        "pods",
        ["cluster"],
        unique=False,
        postgresql_where=sa.text(EVICTED),
        sqlite_where=sa.text(EVICTED),
    )
    op.drop_index("ix_audit_events_type", table_name="audit_events")
    op.create_index(
        "ix_audit_events_disruptions",
        "audit_events",
        ["cluster", "type"],
        unique=False,
        postgresql_where=sa.text(DISRUPTIONS),
        sqlite_where=sa.text(DISRUPTIONS),
    )


def downgrade() -> None:
    op.drop_index("ix_audit_events_disruptions", table_name="audit_events")
    op.create_index("ix_audit_events_type", "audit_events", ["cluster", "type"], unique=False)
    op.drop_index("ix_pods_evicted", table_name="pods")
    op.create_index("ix_pods_cluster_status", "pods", ["cluster", "status"], unique=False)
