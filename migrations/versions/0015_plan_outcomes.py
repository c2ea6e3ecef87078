"""plan outcomes: each run's predictions beside what the service measured of it

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-04 22:00:00.000000

`plan_outcomes` holds, per run, what the planner predicted when it admitted the run (step
time, tokens/s per GPU, MFU, checkpoint cost, restart time, and the published-figure step
split into compute and communication that calibration fits against) and what the service
measured while it trained (steady-state step time and what follows from it, the median
save stall, each recovery's phases). `runyard plan accuracy` reads it; later plans are
calibrated from it (service/plans/history.py).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "plan_outcomes",
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("hardware", sa.String(length=32), nullable=False),
        sa.Column("accelerator", sa.String(length=16), nullable=False),
        sa.Column("num_params", sa.BigInteger(), nullable=False),
        sa.Column("layout_family", sa.String(length=32), nullable=False),
        sa.Column("num_gpus", sa.Integer(), nullable=False),
        sa.Column("seq_len", sa.Integer(), nullable=False),
        sa.Column("global_batch_tokens", sa.BigInteger(), nullable=False),
        sa.Column("predicted_step_s", sa.Float(), nullable=False),
        sa.Column("predicted_tokens_per_s_per_gpu", sa.Float(), nullable=False),
        sa.Column("predicted_mfu", sa.Float(), nullable=False),
        sa.Column("predicted_checkpoint_s", sa.Float(), nullable=False),
        sa.Column("predicted_restart_s", sa.Float(), nullable=True),
        sa.Column("uncalibrated_step_s", sa.Float(), nullable=False),
        sa.Column("uncalibrated_compute_s", sa.Float(), nullable=False),
        sa.Column("uncalibrated_communication_s", sa.Float(), nullable=False),
        sa.Column("uncalibrated_checkpoint_s", sa.Float(), nullable=False),
        sa.Column("calibrated", sa.Boolean(), nullable=False),
        sa.Column("calibration_runs", sa.Integer(), nullable=False),
        sa.Column("measured_step_s", sa.Float(), nullable=True),
        sa.Column("measured_tokens_per_s_per_gpu", sa.Float(), nullable=True),
        sa.Column("measured_mfu", sa.Float(), nullable=True),
        sa.Column("num_measured_steps", sa.Integer(), nullable=False),
        sa.Column("measured_checkpoint_s", sa.Float(), nullable=True),
        sa.Column("num_checkpoints", sa.Integer(), nullable=False),
        sa.Column("measured_restart_s", sa.Float(), nullable=True),
        sa.Column("recoveries", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("measured_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.id"],
            name=op.f("fk_plan_outcomes_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_id", name=op.f("pk_plan_outcomes")),
    )
    op.create_index(op.f("ix_plan_outcomes_hardware"), "plan_outcomes", ["hardware"])


def downgrade() -> None:
    op.drop_index(op.f("ix_plan_outcomes_hardware"), table_name="plan_outcomes")
    op.drop_table("plan_outcomes")
