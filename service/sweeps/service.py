"""Accept a sweep (its member runs are created at once), describe it, cancel it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.auth.principal import Principal
from service.clusters import registry
from service.config import Settings
from service.errors import Conflict, InvalidSpec, NotFound
from service.identity.owner_folders import owner_root
from service.identity.service import owner_for
from service.models import Run, RunState, Sweep
from service.runs import repository
from service.runs.service import cancel_run, check_quota, create_run, dry_run
from service.slurm.submit import sweep_job_name
from service.sweeps.grid import expand
from service.sweeps.schemas import (
    SweepDecision,
    SweepOut,
    SweepPointDecision,
    SweepRunOut,
    SweepSpec,
)


def create_sweep(
    session: Session, spec: SweepSpec, settings: Settings, principal: Principal
) -> tuple[Sweep, list[Run]]:
    """Every member is resolved and admitted like a run; one bad point refuses the sweep."""
    members = expand(spec)
    at_once = min(spec.sweep.max_parallel, len(members))
    check_quota(session, principal.team, at_once * spec.nodes * spec.gpus_per_node)
    owner = owner_for(session, principal, settings, spec.priority)  # the array runs as them
    # One array, one cluster: with several, the first member's choice holds for them all.
    several = spec.cluster is None and len(registry.clusters(settings)) > 1
    with session.begin_nested():  # all of the sweep or none of it
        sweep = Sweep(
            name=spec.name,
            owner=principal.user,
            team=principal.team,
            unix_user=owner.unix_user,
            slurm_account=owner.slurm_account,
            spec=spec.model_dump(mode="json"),
            max_parallel=spec.sweep.max_parallel,
            array_attempt_ids=[],
        )
        session.add(sweep)
        session.flush()
        sweep.job_name = sweep_job_name(settings.slurm_job_prefix, sweep.id)
        sweep.job_folder = str(
            owner_root(settings.jobs_dir, sweep)
            / f"sweep-{sweep.id:06d}-{sweep.created_at:%Y%m%dT%H%M%S}"
        )
        runs: list[Run] = []
        for index, (point, member) in enumerate(members):
            if runs and several:
                member = member.model_copy(update={"cluster": runs[0].cluster})
            try:
                run = create_run(session, member, settings, principal, quota=False)
            except InvalidSpec as exc:
                raise InvalidSpec(
                    f"sweep.grid: the point {point} cannot run: {exc.detail}"
                ) from exc
            run.sweep_id, run.sweep_index, run.sweep_params = sweep.id, index, point
            runs.append(run)
        session.flush()
    return sweep, runs


def dry_run_sweep(
    session: Session, spec: SweepSpec, settings: Settings, principal: Principal
) -> SweepDecision:
    """What `create_sweep` would decide for every point, creating nothing."""
    points = expand(spec)
    at_once = min(spec.sweep.max_parallel, len(points))
    check_quota(session, principal.team, at_once * spec.nodes * spec.gpus_per_node)
    decided = []
    for point, member in points:
        try:
            decision = dry_run(session, member, settings)  # quota: checked for the group
        except InvalidSpec as exc:
            raise InvalidSpec(f"sweep.grid: the point {point} cannot run: {exc.detail}") from exc
        decided.append(SweepPointDecision(params=point, decision=decision))
    return SweepDecision(points=decided, max_parallel=at_once)


def require_sweep(session: Session, sweep_id: int, principal: Principal) -> Sweep:
    missing = f"no sweep with id {sweep_id}; `runyard sweep list` shows the sweeps"
    sweep = session.get(Sweep, sweep_id)
    if sweep is None:
        raise NotFound(missing)
    principal.require_team_of(sweep.team, missing)
    return sweep


def members(session: Session, sweep_id: int) -> Sequence[Run]:
    return repository.sweep_runs(session, sweep_id)


def list_sweeps(
    session: Session, principal: Principal, limit: int, offset: int
) -> tuple[list[tuple[Sweep, Sequence[Run]]], int]:
    stmt = select(Sweep).order_by(Sweep.id.desc())
    count = select(func.count()).select_from(Sweep)
    if not principal.is_admin:
        stmt, count = (
            stmt.where(Sweep.team == principal.team),
            count.where(Sweep.team == principal.team),
        )
    sweeps = session.scalars(stmt.limit(limit).offset(offset)).all()
    return [(s, members(session, s.id)) for s in sweeps], session.scalar(count) or 0


def cancel_sweep(session: Session, sweep: Sweep, principal: Principal) -> None:
    """Cancel every member still going; the reconciler scancels their array tasks."""
    going = False
    for run in members(session, sweep.id):
        if run.state == RunState.CANCELLING:
            going = True
        elif not run.state.is_terminal:
            try:  # cancel_run locks the run and reads its state afresh
                cancel_run(session, run.id, principal)
                going = True
            except Conflict:
                continue  # it ended while this request waited for its lock
    if not going:
        raise Conflict(f"sweep {sweep.id} already ended; nothing to cancel")


def sweep_state(states: Sequence[RunState]) -> RunState:
    """Active while any member is; then FAILED if any failed, else CANCELLED or SUCCEEDED."""
    for active in (RunState.RUNNING, RunState.CANCELLING, RunState.PENDING):
        if active in states:
            return active
    for ended in (RunState.FAILED, RunState.CANCELLED):
        if ended in states:
            return ended
    return RunState.SUCCEEDED


def sweep_out(sweep: Sweep, runs: Sequence[Run]) -> SweepOut:
    return SweepOut(
        id=sweep.id,
        name=sweep.name,
        owner=sweep.owner,
        team=sweep.team,
        state=sweep_state([r.state for r in runs]),
        grid=sweep.spec["sweep"]["grid"],
        max_parallel=sweep.max_parallel,
        slurm_array_job_id=sweep.slurm_array_job_id,
        created_at=sweep.created_at,
        submitted_at=sweep.submitted_at,
        counts=dict(Counter(r.state.value for r in runs)),
        runs=[
            SweepRunOut(
                id=r.id,
                index=r.sweep_index or 0,
                name=r.name,
                state=r.state,
                params=r.sweep_params or {},
                slurm_job_id=r.attempts[-1].slurm_job_id if r.attempts else None,
                last_step=r.last_step,
                last_loss=r.last_loss,
            )
            for r in runs
        ],
    )
