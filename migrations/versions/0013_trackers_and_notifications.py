"""trackers and notifications: export cursors per run and tracker, webhook outbox, lr per step

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-04 19:30:00.000000

`tracker_exports` holds, per run and tracker (mlflow, wandb, tensorboard), the tracker's
run and the cursor of the steps and events already in it, so a run that restarted is one
tracker run with each step once, and a service killed mid-export resumes where it
stopped. `notification_subscriptions` are a team's webhooks; `notification_deliveries` is
their outbox (written in the transaction that recorded the event) and delivery log. A
metric row also keeps the learning rate its step used.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The values as of this revision (a migration never imports live code).
TRACKERS = ("mlflow", "wandb", "tensorboard")
EXPORT_STATES = ("EXPORTING", "FINISHED")
FORMATS = ("json", "slack")
EVENTS = (
    "run.failed",
    "run.succeeded",
    "run.moved",
    "incident.opened",
    "rollback",
    "goodput.low",
    "test",
)
DELIVERY_STATES = ("PENDING", "DELIVERED", "GAVE_UP")


def _enum(name: str, values: Sequence[str], length: int) -> sa.Enum:
    return sa.Enum(*values, name=name, native_enum=False, length=length, create_constraint=False)


def upgrade() -> None:
    op.add_column("metrics", sa.Column("lr", sa.Float(), nullable=True))
    op.create_table(
        "tracker_exports",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=False),
        sa.Column("tracker", _enum("tracker_kind", TRACKERS, 16), nullable=False),
        sa.Column("state", _enum("export_state", EXPORT_STATES, 16), nullable=False),
        sa.Column("tracker_run_id", sa.String(length=512), nullable=True),
        sa.Column("exported_step", sa.Integer(), server_default="0", nullable=False),
        sa.Column(
            "exported_event_ids",
            postgresql.ARRAY(sa.BigInteger()),
            server_default="{}",
            nullable=False,
        ),
        sa.Column("in_flight", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
        sa.Column("num_failures", sa.Integer(), server_default="0", nullable=False),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("next_try_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_exported_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.id"],
            name=op.f("fk_tracker_exports_run_id_runs"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_tracker_exports")),
        sa.UniqueConstraint("run_id", "tracker", name=op.f("uq_tracker_exports_run_id")),
    )
    op.create_index(op.f("ix_tracker_exports_run_id"), "tracker_exports", ["run_id"])

    op.create_table(
        "notification_subscriptions",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("team", sa.String(length=64), nullable=False),
        sa.Column("owner", sa.String(length=64), nullable=False),
        sa.Column("url", sa.Text(), nullable=False),
        sa.Column("events", postgresql.ARRAY(sa.String(length=32)), nullable=False),
        sa.Column("format", _enum("notification_format", FORMATS, 8), nullable=False),
        sa.Column("secret", sa.String(length=128), nullable=False),
        sa.Column("removed_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column(
            "created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column(
            "updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_notification_subscriptions")),
    )
    op.create_index(
        op.f("ix_notification_subscriptions_team"), "notification_subscriptions", ["team"]
    )

    op.create_table(
        "notification_deliveries",
        sa.Column("id", sa.BigInteger(), nullable=False),
        sa.Column("subscription_id", sa.Integer(), nullable=False),
        sa.Column("team", sa.String(length=64), nullable=False),
        sa.Column("run_id", sa.Integer(), nullable=True),
        sa.Column("event", _enum("notification_event", EVENTS, 32), nullable=False),
        sa.Column("dedupe_key", sa.String(length=128), nullable=False),
        sa.Column("payload", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("state", _enum("delivery_state", DELIVERY_STATES, 16), nullable=False),
        sa.Column("num_tries", sa.Integer(), server_default="0", nullable=False),
        sa.Column("next_try_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("leased_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_status", sa.Integer(), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("last_tried_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("delivered_at", sa.DateTime(timezone=True), nullable=True),
        sa.ForeignKeyConstraint(
            ["subscription_id"],
            ["notification_subscriptions.id"],
            name=op.f("fk_notification_deliveries_subscription_id_notification_subscriptions"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["run_id"],
            ["runs.id"],
            name=op.f("fk_notification_deliveries_run_id_runs"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_notification_deliveries")),
        sa.UniqueConstraint(
            "subscription_id",
            "dedupe_key",
            name=op.f("uq_notification_deliveries_subscription_id"),
        ),
    )
    op.create_index(
        op.f("ix_notification_deliveries_subscription_id"),
        "notification_deliveries",
        ["subscription_id"],
    )
    op.create_index(
        "ix_notification_deliveries_due", "notification_deliveries", ["state", "next_try_at"]
    )


def downgrade() -> None:
    op.drop_table("notification_deliveries")
    op.drop_table("notification_subscriptions")
    op.drop_table("tracker_exports")
    op.drop_column("metrics", "lr")
