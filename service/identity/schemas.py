"""The identity API's bodies."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict, Field

from service.config import ServiceEnvironment


class UserLinkRequest(BaseModel):
    """Link a runyard user to the Unix user their jobs run as."""

    unix_user: str = Field(description="The login their ranks and scripts run as (not root).")
    slurm_account: str | None = Field(
        default=None, description="The Slurm account their jobs are charged to (default: the team)."
    )


class UserLinkOut(BaseModel):
    model_config = ConfigDict(from_attributes=True)

    user: str
    unix_user: str
    slurm_account: str | None = Field(description="None: the submitting token's team.")
    linked_by: str
    updated_at: datetime


class ServiceIdentity(BaseModel):
    """Who the service itself runs as, and what of its environment reaches users' jobs: what
    `runyard doctor` checks (never root; no test fault hooks on a site)."""

    unix_user: str
    uid: int
    is_root: bool
    environment: ServiceEnvironment  # site, or dev: fault hooks are handed to jobs
    fault_hooks: list[str]  # names of the RUNYARD_FAULT* variables set (not their values)
