"""stop reasons and do-not-retry as typed columns; per-attempt progress summaries

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03 10:30:00.000000

The stop reason was free text that code matched by prefix ("preempted by run 1" also
matched run 12's), and a worker's do-not-retry hid in `exit_code` while the job still ran.
Both become typed columns; the run a preemption made room for gets its own column. Each
attempt also carries a progress summary (highest step, time of its last report), so goodput
no longer reads every metric row: old attempts are backfilled from their metrics here.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# contract.StopReason's values as of this revision (a migration never imports live code).
STOP_REASONS = (
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
DO_NOT_RETRY_EXIT = 3  # contract.ExitCode.DO_NOT_RETRY

# One statement: the newest report time and highest step of each attempt, from its metrics.
BACKFILL_PROGRESS = """
UPDATE attempts AS a
SET last_step = m.last_step, last_progress_at = m.last_progress_at
FROM (
    SELECT attempt_id, max(step) AS last_step, max(recorded_at) AS last_progress_at
    FROM metrics
    GROUP BY attempt_id
) AS m
WHERE m.attempt_id = a.id
"""


def upgrade() -> None:
    op.add_column("attempts", sa.Column("stopped_for_run_id", sa.Integer(), nullable=True))
    op.create_foreign_key(
        op.f("fk_attempts_stopped_for_run_id_runs"),
        "attempts",
        "runs",
        ["stopped_for_run_id"],
        ["id"],
        ondelete="SET NULL",
    )
    # The text written so far was "preempted by run N (priority)" or "segment time limit".
    op.execute(
        "UPDATE attempts SET stopped_for_run_id = r.id FROM runs AS r "
        "WHERE attempts.stop_reason LIKE 'preempted by run %' "
        "AND r.id = substring(attempts.stop_reason from 'preempted by run ([0-9]+)')::int"
    )
    op.execute(
        "ALTER TABLE attempts ALTER COLUMN stop_reason TYPE VARCHAR(24) USING CASE "
        "WHEN stop_reason LIKE 'preempted%' THEN 'preempted' "
        "WHEN stop_reason LIKE 'segment time limit%' THEN 'time_limit' END"
    )
    # Attempts that ended before this revision: the causes their state alone tells.
    op.execute(
        "UPDATE attempts SET stop_reason = CASE state "
        "WHEN 'SUCCEEDED' THEN 'completed' WHEN 'CANCELLED' THEN 'cancelled' END "
        "WHERE stop_reason IS NULL AND state IN ('SUCCEEDED', 'CANCELLED')"
    )
    values = ", ".join(f"'{v}'" for v in STOP_REASONS)
    op.create_check_constraint(
        op.f("ck_attempts_stop_reason"), "attempts", f"stop_reason IN ({values})"
    )
    op.create_check_constraint(
        op.f("ck_attempts_stopped_for_run_only_when_preempted"),
        "attempts",
        "stopped_for_run_id IS NULL OR stop_reason = 'preempted'",
    )

    op.add_column(
        "attempts",
        sa.Column("do_not_retry", sa.Boolean(), server_default=sa.false(), nullable=False),
    )
    # The old flag: exit_code 3 written by the worker's report while the job still ran.
    op.execute(f"UPDATE attempts SET do_not_retry = true WHERE exit_code = {DO_NOT_RETRY_EXIT}")
    op.execute(
        "UPDATE attempts SET exit_code = NULL "
        "WHERE do_not_retry AND state NOT IN ('SUCCEEDED', 'FAILED', 'CANCELLED', 'STOPPED')"
    )
    op.execute(
        "UPDATE attempts SET stop_reason = 'do_not_retry' "
        "WHERE do_not_retry AND state = 'FAILED' AND stop_reason IS NULL"
    )

    op.add_column("attempts", sa.Column("last_step", sa.Integer(), nullable=True))
    op.add_column(
        "attempts", sa.Column("last_progress_at", sa.DateTime(timezone=True), nullable=True)
    )
    op.execute(BACKFILL_PROGRESS)


def downgrade() -> None:
    op.drop_column("attempts", "last_progress_at")
    op.drop_column("attempts", "last_step")
    op.execute(
        f"UPDATE attempts SET exit_code = {DO_NOT_RETRY_EXIT} "
        "WHERE do_not_retry AND exit_code IS NULL"
    )
    op.drop_column("attempts", "do_not_retry")
    op.drop_constraint(
        op.f("ck_attempts_stopped_for_run_only_when_preempted"), "attempts", type_="check"
    )
    op.drop_constraint(op.f("ck_attempts_stop_reason"), "attempts", type_="check")
    # Back to the text the old code matched: only the stops it asked for had one.
    op.execute(
        "ALTER TABLE attempts ALTER COLUMN stop_reason TYPE TEXT USING CASE stop_reason "
        "WHEN 'preempted' THEN 'preempted by run ' || coalesce(stopped_for_run_id::text, '?') "
        "WHEN 'time_limit' THEN 'segment time limit' END"
    )
    op.drop_constraint(op.f("fk_attempts_stopped_for_run_id_runs"), "attempts", type_="foreignkey")
    op.drop_column("attempts", "stopped_for_run_id")
