"""one run per sweep grid point

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03 08:05:00.000000
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_unique_constraint(op.f("uq_runs_sweep_id"), "runs", ["sweep_id", "sweep_index"])


def downgrade() -> None:
    op.drop_constraint(op.f("uq_runs_sweep_id"), "runs", type_="unique")
