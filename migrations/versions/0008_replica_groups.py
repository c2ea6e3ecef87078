"""replica groups: an attempt's group, a run's lighthouse, an incident's recovery path

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-03 11:20:00.000000

A fault-tolerant run trains as replica groups, one Slurm job (one attempt row) per group;
the service starts a torchft lighthouse per such run and keeps its address and process id
with the run. Incidents record which recovery path carried them out and, for the classic
path, why the fast one could not (service/recovery/paths.py).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("attempts", sa.Column("replica_group", sa.Integer(), nullable=True))
    op.add_column("runs", sa.Column("lighthouse_addr", sa.String(length=128), nullable=True))
    op.add_column("runs", sa.Column("lighthouse_pid", sa.Integer(), nullable=True))
    op.add_column("incidents", sa.Column("recovery_path", sa.String(length=16), nullable=True))
    op.add_column("incidents", sa.Column("classic_because", sa.String(length=48), nullable=True))


def downgrade() -> None:
    op.drop_column("incidents", "classic_because")
    op.drop_column("incidents", "recovery_path")
    op.drop_column("runs", "lighthouse_pid")
    op.drop_column("runs", "lighthouse_addr")
    op.drop_column("attempts", "replica_group")
