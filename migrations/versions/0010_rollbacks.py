"""loss spikes and non-finite values: two new stop reasons

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-03 15:00:00.000000

An attempt whose worker saw a non-finite or spiking loss or gradient norm ends
`rolled_back` (the next attempt resumes from the checkpoint before it with a window of data
skipped; no restart counted); anomalies at the same place after the rollbacks a run allows
end it `repeated_anomaly`. The skipped windows live in `runs.config` (JSON: no column).
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# contract.StopReason's values as of this revision (a migration never imports live code).
STOP_REASONS_0009 = (
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
)
STOP_REASONS = (*STOP_REASONS_0009, "rolled_back", "repeated_anomaly")


def _stop_reason_check(values: Sequence[str]) -> None:
    op.drop_constraint(op.f("ck_attempts_stop_reason"), "attempts", type_="check")
    listed = ", ".join(f"'{v}'" for v in values)
    op.create_check_constraint(
        op.f("ck_attempts_stop_reason"), "attempts", f"stop_reason IN ({listed})"
    )


def upgrade() -> None:
    _stop_reason_check(STOP_REASONS)


def downgrade() -> None:
    op.execute(
        "UPDATE attempts SET stop_reason = 'job_failed' "
        "WHERE stop_reason IN ('rolled_back', 'repeated_anomaly')"
    )
    _stop_reason_check(STOP_REASONS_0009)
