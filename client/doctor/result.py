"""What a check reports, and where the doctor reads the site's settings from.

The doctor runs on the head node beside the service but never imports it (the CLI talks to
the service over HTTP): it reads the same `RUNYARD_*` settings file the systemd unit loads.
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass, field
from pathlib import Path

from client.api import RunyardClient
from client.dev_state import default_state_dir

SITE_SETTINGS_FILE = Path("/etc/runyard/runyard.env")


class Status(enum.StrEnum):
    OK = "ok"
    WARN = "warn"  # works, but a site should look at it; does not fail the doctor
    FAIL = "FAIL"
    SKIP = "skip"  # could not be checked because an earlier check failed


class Area(enum.StrEnum):
    SLURM = "slurm"
    POSTGRES = "postgres"
    FILESYSTEM = "filesystem"
    AGENTS = "agents"
    IDENTITY = "identity"
    WIRE = "wire"  # TLS and MUNGE: what crosses the network (client/doctor/wire.py)


@dataclass(frozen=True)
class Check:
    area: Area
    name: str
    status: Status
    detail: str
    fix: str = ""


def passed(area: Area, name: str, detail: str) -> Check:
    return Check(area, name, Status.OK, detail)


def failed(area: Area, name: str, detail: str, fix: str) -> Check:
    return Check(area, name, Status.FAIL, detail, fix)


def skipped(area: Area, name: str, because: str) -> Check:
    return Check(area, name, Status.SKIP, because)


def read_env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as systemd's EnvironmentFile reads them (comments and blanks ignored,
    one pair of surrounding quotes removed)."""
    values: dict[str, str] = {}
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, _, value = line.partition("=")
        value = value.strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        values[key.strip()] = value
    return values


def _dev_database_url() -> str:
    """The dev cluster's database: imported here, not at the top, because every `runyard`
    call imports the doctor's modules to list its commands, and the dev cluster's
    machinery (Postgres drivers among it) was 0.5 s of each call's start."""
    from client.devcluster.cluster import default_database_url

    return default_database_url()


@dataclass(frozen=True)
class SiteSettings:
    """The part of the service's settings the doctor needs, resolved like the service does."""

    service_url: str
    database_url: str
    slurm_conf: str | None
    partition: str
    checkpoint_root: Path
    min_free_gb: float = 20.0
    heartbeat_max_age_s: float = 20.0
    probe_nodes: int = 2
    extra: dict[str, str] = field(default_factory=dict)
    settings_file: Path | None = None  # the file they were read from, if any

    @classmethod
    def load(cls, settings_file: Path | None) -> SiteSettings:
        """The settings file (if any), overridden by the environment."""
        values: dict[str, str] = {}
        path = settings_file or (SITE_SETTINGS_FILE if SITE_SETTINGS_FILE.exists() else None)
        if path is not None:
            values.update(read_env_file(path))
        values.update({k: v for k, v in os.environ.items() if k.startswith(("RUNYARD_", "SLURM"))})
        state_dir = Path(values.get("RUNYARD_STATE_DIR", str(default_state_dir())))
        checkpoints = values.get("RUNYARD_CHECKPOINT_ROOT") or str(state_dir / "checkpoints")
        port = values.get("RUNYARD_PORT", "8000")
        url = values.get("RUNYARD_URL") or values.get("RUNYARD_PUBLIC_URL")
        return cls(
            service_url=url or f"http://127.0.0.1:{port}",
            database_url=values.get("RUNYARD_DATABASE_URL") or _dev_database_url(),
            slurm_conf=values.get("RUNYARD_SLURM_CONF") or values.get("SLURM_CONF"),
            partition=values.get("RUNYARD_PARTITION", "train"),
            checkpoint_root=Path(checkpoints),
            extra=values,
            settings_file=path,
        )

    def client(self) -> RunyardClient:
        """An API client that reaches the service as the site's clients do: its URL, its
        certificate verified with the RUNYARD_CA of the settings (the environment's over
        the file's), 10 s a call."""
        return RunyardClient(self.service_url, timeout_s=10, ca=self.extra.get("RUNYARD_CA"))

    def slurm_env(self) -> dict[str, str]:
        env = dict(os.environ)
        if self.slurm_conf:
            env["SLURM_CONF"] = self.slurm_conf
        return env
