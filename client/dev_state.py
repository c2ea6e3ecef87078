"""Where the local dev cluster keeps its state (.runyard/dev, or RUNYARD_DEV_DIR): the folder
`runyard dev` manages (client/devcluster/), and where every command finds the dev cluster's
admin token when no other token is set (client/token_store.py). Paths and environment only, so the
API client reads it without importing the dev cluster's machinery, which uses the client."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]  # the checkout the dev cluster runs from
# `runyard dev up --clusters`: runyard-dev and runyard-dev-b. Two: a third's ports (4000
# above, slurmds from 21001) would fall among the ones the tests' own listeners draw from
# (tests/conftest.py, LISTEN_PORTS).
MAX_CLUSTERS = 2


def default_slurm_prefix() -> Path | None:
    """The Slurm prefix the dev cluster runs on (RUNYARD_DEV_SLURM, as `dev up --slurm`
    sets it); None: Debian's packaged Slurm on PATH."""
    prefix = os.environ.get("RUNYARD_DEV_SLURM")
    return Path(prefix).resolve() if prefix else None


def default_state_dir(slurm_prefix: Path | None = None) -> Path:
    """RUNYARD_DEV_DIR, else .runyard/dev; a cluster on a Slurm prefix of its own gets a
    folder of its own (.runyard/dev-slurm-24.11 for /opt/slurm-24.11)."""
    prefix = slurm_prefix or default_slurm_prefix()
    name = f"dev-{prefix.name}" if prefix else "dev"
    return Path(os.environ.get("RUNYARD_DEV_DIR", REPO_ROOT / ".runyard" / name)).resolve()


def dev_ca_file() -> Path:
    """The dev cluster's CA certificate (client/devcluster/tls.py), which the CLI trusts for
    loopback URLs when RUNYARD_CA names none."""
    return default_state_dir() / "tls" / "ca.pem"
