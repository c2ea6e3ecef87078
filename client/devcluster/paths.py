"""Where the dev cluster finds the checkout it runs from (templates, examples, alembic.ini)."""

from __future__ import annotations

from client.dev_state import REPO_ROOT

__all__ = ["REPO_ROOT"]
