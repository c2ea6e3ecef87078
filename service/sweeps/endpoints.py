"""/v1/sweeps: a grid of runs submitted as one Slurm job array."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status
from pydantic import BaseModel

from service.auth.deps import USERS, PrincipalDep
from service.config import get_settings
from service.db import SessionDep
from service.errors import DbId
from service.sweeps import service
from service.sweeps.schemas import SweepDecision, SweepOut, SweepSpec

router = APIRouter(prefix="/v1/sweeps", tags=["sweeps"], dependencies=[USERS])


class SweepList(BaseModel):
    items: list[SweepOut]
    total: int


@router.post("", status_code=status.HTTP_201_CREATED)
def submit_sweep(spec: SweepSpec, session: SessionDep, principal: PrincipalDep) -> SweepOut:
    """One run per grid point; the reconciler submits their first attempts as one job array
    with `%max_parallel`. Retries after a failure are ordinary single submissions."""
    sweep, runs = service.create_sweep(session, spec, get_settings(), principal)
    return service.sweep_out(sweep, runs)


@router.post("/dry-run")
def dry_run_sweep(spec: SweepSpec, session: SessionDep, principal: PrincipalDep) -> SweepDecision:
    """What the service would decide for every grid point (layout, plan), creating nothing."""
    return service.dry_run_sweep(session, spec, get_settings(), principal)


@router.get("")
def list_sweeps(
    session: SessionDep,
    principal: PrincipalDep,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**62)] = 0,
) -> SweepList:
    """Sweeps, newest first."""
    rows, total = service.list_sweeps(session, principal, limit, offset)
    return SweepList(items=[service.sweep_out(s, runs) for s, runs in rows], total=total)


@router.get("/{sweep_id}")
def show_sweep(sweep_id: DbId, session: SessionDep, principal: PrincipalDep) -> SweepOut:
    """One sweep with its runs and their grid points."""
    sweep = service.require_sweep(session, sweep_id, principal)
    return service.sweep_out(sweep, service.members(session, sweep.id))


@router.post("/{sweep_id}/cancel", status_code=status.HTTP_202_ACCEPTED)
def cancel_sweep(sweep_id: DbId, session: SessionDep, principal: PrincipalDep) -> SweepOut:
    """Cancel every member still going (queued array tasks included)."""
    sweep = service.require_sweep(session, sweep_id, principal)
    service.cancel_sweep(session, sweep, principal)
    return service.sweep_out(sweep, service.members(session, sweep.id))
