"""/v1/runs: what ML engineers call."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, status

from service.auth.deps import USERS, PrincipalDep
from service.clusters.deps import ClusterQuery, cluster_name
from service.config import get_settings
from service.db import SessionDep
from service.errors import DbId
from service.models import RunState
from service.runs import repository
from service.runs.schemas import (
    CheckpointOut,
    MetricOut,
    RunDecision,
    RunEventOut,
    RunList,
    RunOut,
    RunSpec,
)
from service.runs.service import (
    cancel_run,
    create_run,
    dry_run,
    require_run,
    run_goodput,
    run_out,
)

router = APIRouter(prefix="/v1/runs", tags=["runs"], dependencies=[USERS])


@router.post("", status_code=status.HTTP_201_CREATED)
def submit_run(spec: RunSpec, session: SessionDep, principal: PrincipalDep) -> RunOut:
    """Validate and plan a run; the reconciler submits it to Slurm."""
    return run_out(create_run(session, spec, get_settings(), principal))


@router.post("/dry-run")
def dry_run_run(spec: RunSpec, session: SessionDep, principal: PrincipalDep) -> RunDecision:
    """What the service would decide for a spec (layout, plan, quota), creating nothing."""
    return dry_run(session, spec, get_settings(), principal)


@router.get("")
def list_runs(
    session: SessionDep,
    principal: PrincipalDep,
    state: RunState | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    offset: Annotated[int, Query(ge=0, le=2**62)] = 0,
    cluster: ClusterQuery = None,
) -> RunList:
    """Runs (of one cluster, if given), newest first."""
    team = None if principal.is_admin else principal.team
    on = cluster_name(cluster) if cluster is not None else None
    runs, total = repository.list_runs(session, state, limit, offset, team, on)
    return RunList(items=[run_out(r) for r in runs], total=total)


@router.get("/{run_id}")
def show_run(run_id: DbId, session: SessionDep, principal: PrincipalDep) -> RunOut:
    """One run with its attempts."""
    run = require_run(session, run_id, principal)
    return run_out(run, run_goodput(session, run))


@router.post("/{run_id}/cancel", status_code=status.HTTP_202_ACCEPTED)
def cancel(
    run_id: DbId,
    session: SessionDep,
    principal: PrincipalDep,
    now: Annotated[
        bool, Query(description="scancel at once, without asking the ranks to save first")
    ] = False,
) -> RunOut:
    """Ask for a run to stop: its training ranks save a checkpoint and exit 0 (within
    `RUNYARD_STOP_GRACE_S`, else they are scancelled); `now` scancels its jobs at once."""
    return run_out(cancel_run(session, run_id, principal, now=now))


@router.get("/{run_id}/checkpoints")
def list_checkpoints(
    run_id: DbId, session: SessionDep, principal: PrincipalDep
) -> list[CheckpointOut]:
    """The run's checkpoints, oldest first, with their state."""
    require_run(session, run_id, principal)
    return [CheckpointOut.model_validate(c) for c in repository.checkpoints(session, run_id)]


@router.get("/{run_id}/events")
def list_events(
    run_id: DbId,
    session: SessionDep,
    principal: PrincipalDep,
    after_id: Annotated[int, Query(ge=0, le=2**62)] = 0,
    limit: Annotated[int, Query(ge=1, le=1000)] = 200,
) -> list[RunEventOut]:
    """The run's timeline: state changes, attempts, checkpoints."""
    require_run(session, run_id, principal)
    return [
        RunEventOut.model_validate(e) for e in repository.events(session, run_id, after_id, limit)
    ]


@router.get("/{run_id}/metrics")
def list_metrics(
    run_id: DbId,
    session: SessionDep,
    principal: PrincipalDep,
    after_step: Annotated[int, Query(ge=-1, le=2**31)] = -1,
    limit: Annotated[int, Query(ge=1, le=10000)] = 1000,
) -> list[MetricOut]:
    """Per-step loss and throughput as rank 0 reported them, across attempts."""
    require_run(session, run_id, principal)
    return [
        MetricOut.model_validate(m) for m in repository.metrics(session, run_id, after_step, limit)
    ]
