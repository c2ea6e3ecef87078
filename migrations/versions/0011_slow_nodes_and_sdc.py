"""slow nodes and silent data corruption: node straggler columns, two new stop reasons

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-03 17:45:00.000000

A node whose ranks are persistently slower than their peers' is flagged SLOW on its row
(`slow_since`, the last ratio to its peers' median, the count of consecutive slow
reports); an attempt asked to move off such a node ends `slow_node`, and one whose
data-parallel replicas disagreed ends `sdc`. The last clean comparison lives in
`runs.config` (JSON: no column).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# contract.StopReason's values as of this revision (a migration never imports live code).
STOP_REASONS_0010 = (
    "preempted",
    "time_limit",
    "completed",
    "cancelled",
    "node_failure",
    "recovery_restart",
    "job_failed",
    "do_not_retry",
    "submission_failed",
    "checkpoint_corrupt",
    "deterministic_failure",
    "rolled_back",
    "repeated_anomaly",
)
STOP_REASONS = (*STOP_REASONS_0010, "slow_node", "sdc")


def _stop_reason_check(values: Sequence[str]) -> None:
    op.drop_constraint(op.f("ck_attempts_stop_reason"), "attempts", type_="check")
    listed = ", ".join(f"'{v}'" for v in values)
    op.create_check_constraint(
        op.f("ck_attempts_stop_reason"), "attempts", f"stop_reason IN ({listed})"
    )


def upgrade() -> None:
    _stop_reason_check(STOP_REASONS)
    op.add_column(
        "nodes", sa.Column("num_slow_reports", sa.Integer(), nullable=False, server_default="0")
    )
    op.add_column("nodes", sa.Column("slow_ratio", sa.Float(), nullable=True))
    op.add_column("nodes", sa.Column("slow_since", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("nodes", "slow_since")
    op.drop_column("nodes", "slow_ratio")
    op.drop_column("nodes", "num_slow_reports")
    op.execute(
        "UPDATE attempts SET stop_reason = 'job_failed' WHERE stop_reason IN ('slow_node', 'sdc')"
    )
    _stop_reason_check(STOP_REASONS_0010)
