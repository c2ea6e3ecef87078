"""Every `runyard` call imports the command tree to find its command: what the tree imports
at the top is paid by each call (a token minted per node, a script polling `run show`). The
dev cluster's machinery and the doctor's checks (Postgres drivers, templates, TLS) load
inside the commands that use them: 1.45 s a call before, 0.7 s after, on the
dev machine's 2 cores."""

from __future__ import annotations

import subprocess
import sys

# Loaded only by the commands that need them (`dev`, `doctor`, `data`), never by the tree.
HEAVY = ("sqlalchemy", "psycopg", "jinja2", "cryptography", "torch")


def test_the_command_tree_loads_no_database_driver_template_engine_or_torch() -> None:
    code = f"import sys, client.cli; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "", f"imported by `runyard` at its start: {done.stdout}"
