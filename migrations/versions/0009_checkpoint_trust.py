"""checkpoints you can trust: CORRUPT checkpoints and why; two new stop reasons

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-03 14:10:00.000000

A checkpoint whose files fail their checksums (at commit or at load) is marked CORRUPT
(`checkpoints.state` is a VARCHAR(16) without a check constraint: nothing to alter) with the
reason, the time and the attempt that found it. Attempts gain two stop reasons:
`checkpoint_corrupt` (the resume checkpoint failed its checksums; no restart counted) and
`deterministic_failure` (the same failure at the same step twice: the run stops).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# contract.StopReason's values as of this revision (a migration never imports live code).
STOP_REASONS_0007 = (
    "preempted",
    "time_limit",
    "completed",
    "cancelled",
    "node_failure",
    "recovery_restart",
    "job_failed",
    "do_not_retry",
    "submission_failed",
)
STOP_REASONS = (*STOP_REASONS_0007, "checkpoint_corrupt", "deterministic_failure")


def _stop_reason_check(values: Sequence[str]) -> None:
    op.drop_constraint(op.f("ck_attempts_stop_reason"), "attempts", type_="check")
    listed = ", ".join(f"'{v}'" for v in values)
    op.create_check_constraint(
        op.f("ck_attempts_stop_reason"), "attempts", f"stop_reason IN ({listed})"
    )


def upgrade() -> None:
    op.add_column("checkpoints", sa.Column("corrupt_reason", sa.Text(), nullable=True))
    op.add_column(
        "checkpoints", sa.Column("corrupt_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.add_column("checkpoints", sa.Column("corrupt_attempt_id", sa.Integer(), nullable=True))
    op.create_foreign_key(
        op.f("fk_checkpoints_corrupt_attempt_id_attempts"),
        "checkpoints",
        "attempts",
        ["corrupt_attempt_id"],
        ["id"],
        ondelete="SET NULL",
    )
    _stop_reason_check(STOP_REASONS)


def downgrade() -> None:
    op.execute(
        "UPDATE attempts SET stop_reason = 'job_failed' "
        "WHERE stop_reason IN ('checkpoint_corrupt', 'deterministic_failure')"
    )
    _stop_reason_check(STOP_REASONS_0007)
    # A CORRUPT checkpoint was never safe to load: it reads as deleted to older code.
    op.execute("UPDATE checkpoints SET state = 'DELETED' WHERE state = 'CORRUPT'")
    op.drop_constraint(
        op.f("fk_checkpoints_corrupt_attempt_id_attempts"), "checkpoints", type_="foreignkey"
    )
    op.drop_column("checkpoints", "corrupt_attempt_id")
    op.drop_column("checkpoints", "corrupt_at")
    op.drop_column("checkpoints", "corrupt_reason")
