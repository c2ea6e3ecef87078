"""cluster failover: a stop reason for an attempt whose run moved to another cluster

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06 18:40:00.000000

When a run's whole cluster cannot run it past the site's limit (its controller silent and
its ranks too, or too few healthy nodes with the spares spent), the run continues on another
cluster from its last trusted checkpoint (service/reconcile/failover.py); the attempt it
leaves behind ends `cluster_failover`. The incident that says what the move cost needs no
column: its action is a string (FAIL_OVER) and its move cost lives in `details`.
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# contract.StopReason's values as of revision 0019 (a migration never imports live code).
STOP_REASONS_0019 = (
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
    "slow_node",
    "sdc",
)
STOP_REASONS = (*STOP_REASONS_0019, "cluster_failover")


def _stop_reason_check(values: Sequence[str]) -> None:
    op.drop_constraint(op.f("ck_attempts_stop_reason"), "attempts", type_="check")
    listed = ", ".join(f"'{v}'" for v in values)
    op.create_check_constraint(
        op.f("ck_attempts_stop_reason"), "attempts", f"stop_reason IN ({listed})"
    )


def upgrade() -> None:
    _stop_reason_check(STOP_REASONS)


def downgrade() -> None:
    # An attempt that failed over failed on its cluster: the closest reason before 0020.
    op.execute(
        "UPDATE attempts SET stop_reason = 'node_failure' WHERE stop_reason = 'cluster_failover'"
    )
    _stop_reason_check(STOP_REASONS_0019)
