"""The owner a run was accepted with, as submissions and steps in its jobs need it."""

from __future__ import annotations

from sqlalchemy.orm import Session

from service.config import Settings
from service.identity.service import link_of
from service.models import Run
from service.models.sweep import Sweep
from service.slurm.owner import RunOwner


def owner_of(run: Run | Sweep, settings: Settings | None = None) -> RunOwner:
    """The identity a run (or a sweep's array) was accepted with; its QoS from `settings`
    (what a submission needs; a step inside a running job does not)."""
    priority = run.priority if isinstance(run, Run) else str(run.spec.get("priority", ""))
    return RunOwner(
        unix_user=run.unix_user,
        slurm_account=run.slurm_account,
        qos=settings.qos_by_priority.get(priority) if settings else None,
    )


def adopt_owner(session: Session, run: Run) -> None:
    """A run accepted before owners existed (empty columns) takes its user's link, if any."""
    if run.unix_user:
        return
    link = link_of(session, run.owner)
    if link is not None:
        run.unix_user, run.slurm_account = link.unix_user, link.slurm_account or run.team
