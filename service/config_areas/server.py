"""Database, API and state folders."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from service.config_areas.base import REPO_ROOT, AreaSettings


class ServerSettings(AreaSettings):
    """Database, API and state folders.

    Where the service keeps its durable state (Postgres) and its files, where its API
    listens and how it is reached, and how much one request may ask of it."""

    database_url: str = Field(
        default="postgresql+psycopg://postgres@127.0.0.1:5432/runyard",
        description="SQLAlchemy URL of the Postgres database that holds all durable state.",
    )
    host: str = Field(default="127.0.0.1", description="Address the API listens on.")
    port: int = Field(default=8000, ge=1, le=65535, description="Port the API listens on.")
    public_url: str | None = Field(
        default=None,
        description="URL workers and agents use to reach the API (default http://host:port).",
    )
    max_body_bytes: int = Field(
        default=1 << 20, ge=1024, description="Largest request body accepted (413 above)."
    )
    agent_requests_per_s: float = Field(
        default=20.0, gt=0, description="Sustained requests/s allowed per agent token."
    )
    agent_burst: float = Field(default=100.0, ge=1, description="Requests an agent may burst.")
    state_dir: Path = Field(
        default=REPO_ROOT / ".runyard" / "dev",
        description="Root of job folders, logs, checkpoints and the data cache.",
    )
    checkpoint_root: Path | None = Field(
        default=None, description="Where runs write checkpoints (default state_dir/checkpoints)."
    )

    @property
    def checkpoints_dir(self) -> Path:
        return self.checkpoint_root or self.state_dir / "checkpoints"

    @property
    def jobs_dir(self) -> Path:
        return self.state_dir / "jobs"

    @property
    def data_cache_dir(self) -> Path:
        """Root of the per-user data caches (each user's runs pack and map their own)."""
        return self.state_dir / "data"

    @property
    def service_dir(self) -> Path:
        """The service's own files (lighthouse logs): never in a root users can write to."""
        return self.state_dir / "service"
