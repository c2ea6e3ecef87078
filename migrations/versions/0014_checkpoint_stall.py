"""checkpoint stall: what each save cost training

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04 20:30:00.000000

`checkpoints.stall_s` is what the worker measured a save to cost training: the time it
blocked training plus how much slower the steps beside it ran (worker/checkpoint_cost.py).
Goodput counts it as checkpoint badput; older rows keep none and are counted by their
write time, as before.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("checkpoints", sa.Column("stall_s", sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column("checkpoints", "stall_s")
