"""api_tokens.origin: how each token was made (an admin, the bootstrap, a login, an attempt)

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06 09:00:00.000000

`runyard login` mints tokens that expire, beside the long-lived ones admins make for
automation; a token list shows which is which, and an expired login token's refusal says to
log in again. Existing rows: an attempt's tokens were the service's; the rest are taken as
an admin's (the bootstrap's first tokens cannot be told apart from them afterwards).
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column(
        "api_tokens",
        sa.Column(
            "origin",
            sa.Enum(
                "admin", "bootstrap", "login", "service",
                name="token_origin", native_enum=False, length=16,
            ),
            server_default="admin",
            nullable=False,
        ),
    )  # fmt: skip
    op.execute("UPDATE api_tokens SET origin = 'service' WHERE attempt_id IS NOT NULL")


def downgrade() -> None:
    op.drop_column("api_tokens", "origin")
