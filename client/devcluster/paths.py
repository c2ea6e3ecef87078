"""Where the dev cluster finds the checkout it runs from (templates, examples, alembic.ini)."""

from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
