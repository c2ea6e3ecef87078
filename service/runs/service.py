"""What the API does with runs: accept, resolve, cancel, and describe them."""

from __future__ import annotations

from sqlalchemy.orm import Session

from contract import (
    ModelShape,
    ParallelLayout,
    ReplicaGroupConfig,
    ResumePoint,
    StopReason,
    WorkerRunConfig,
)
from contract.run_config import DataSkip
from planner.resolve import LayoutError
from service.auth.principal import Principal
from service.auth.service import audit
from service.config import Settings
from service.errors import Conflict, InvalidSpec, NotFound, QuotaExceeded
from service.identity.owner_folders import checkpoint_folder, owner_root
from service.identity.service import owner_for
from service.models import Attempt, AttemptState, Run, RunState, Team
from service.runs import cluster_placement, live_interval, plan_outcomes, repository
from service.runs.cluster_placement import Placement
from service.runs.environment import script_python
from service.runs.goodput import achieved_mfu, compute_goodput
from service.runs.goodput_figures import Goodput
from service.runs.planning import (
    acts_as_owner,
    model_shape,
    owner_inputs,
    replica_groups_of,
    stored_plan,
)
from service.runs.run_state_machine import record_event, set_run_state
from service.runs.schemas import (
    AttemptOut,
    ClusterPlanOut,
    HfModelSpec,
    RunDecision,
    RunOut,
    RunSpec,
    ScriptPythonOut,
)
from service.runs.stop_requests import request_stop
from service.runs.tracking_spec import unavailable as trackers_unavailable


def decide(
    session: Session,
    spec: RunSpec,
    settings: Settings,
    principal: Principal | None = None,
    *,
    quota: bool = True,
) -> tuple[ModelShape, Placement, ScriptPythonOut | None]:
    """Everything the service decides about a spec before it becomes a run: who it runs
    as, the cluster, the layout, the plan, the team's quota, and the Python an entrypoint
    runs in, as its owner runs it. `--dry-run` stops here."""
    # An unknown cluster is refused first; each cluster's facts are read before planning.
    facts = cluster_placement.read_facts(session, settings, spec)
    owner = owner_for(session, principal, settings, spec.priority) if principal else None
    if owner is not None and acts_as_owner(spec) and not session.in_nested_transaction():
        # The owner's inputs are read by another process: no transaction waits on it.
        session.rollback()
    try:
        shape = owner_inputs(spec, model_shape(spec), owner, settings)
    except LayoutError as exc:
        raise InvalidSpec(str(exc)) from exc
    placement = cluster_placement.place(spec, shape, facts)
    python = script_python(spec, owner, settings)
    if principal is not None and quota:
        check_quota(session, principal.team, spec.nodes * spec.gpus_per_node)
    team = principal.team if principal is not None else None
    if (problem := trackers_unavailable(spec.tracking, settings, session, team)) is not None:
        raise InvalidSpec(problem)
    return shape, placement, python


def dry_run(
    session: Session, spec: RunSpec, settings: Settings, principal: Principal | None = None
) -> RunDecision:
    """What `create_run` would decide for this spec, creating nothing; with several
    clusters, each one's plan and why the chosen one won."""
    shape, placement, python = decide(session, spec, settings, principal)
    resolved = placement.resolved
    pinned = (
        [] if spec.parallelism == "auto" else sorted(spec.parallelism.model_dump(exclude_none=True))
    )
    return RunDecision(
        model=shape,
        world_size=spec.nodes * spec.gpus_per_node,
        layout=resolved.layout,
        pinned=pinned,
        plan=resolved.plan,
        replica_groups=replica_groups_of(resolved),
        environment=python,
        cluster=placement.cluster.name,
        cluster_why=placement.why,
        clusters=[cluster_plan_out(p, placement) for p in placement.plans]
        if len(placement.plans) > 1 or spec.cluster is not None
        else [],
    )


def cluster_plan_out(plan: cluster_placement.ClusterPlan, placement: Placement) -> ClusterPlanOut:
    """One cluster's row of the dry run's table."""
    option = plan.option
    return ClusterPlanOut(
        name=option.name,
        hardware=plan.config.hardware,
        chosen=option.name == placement.cluster.name,
        unfit=option.unfit,
        why_unfit=option.why_unfit,
        step_time_s=option.step_time_s,
        goodput=option.goodput,
        expected_goodput=option.expected_goodput,
        spares=option.num_spares,
        free_nodes=option.free_nodes,
        starts_now=option.starts_now,
        time_per_step_s=option.time_per_step_s if option.fits else None,
    )


def create_run(
    session: Session,
    spec: RunSpec,
    settings: Settings,
    principal: Principal | None = None,
    *,
    quota: bool = True,
) -> Run:
    """Resolve, plan, place and admit one run; `quota=False` when the caller checked it for
    a group."""
    shape, placement, _ = decide(session, spec, settings, principal, quota=quota)
    resolved = placement.resolved
    owner = owner_for(session, principal, settings, spec.priority) if principal else None
    run = Run(
        name=spec.name,
        cluster=placement.cluster.name,
        owner=principal.user if principal else "",
        team=principal.team if principal else "",
        unix_user=owner.unix_user if owner else "",
        slurm_account=owner.slurm_account if owner else "",
        priority=spec.priority,
        state=RunState.PENDING,
        state_reason="accepted; waiting for Slurm",
        spec=spec.model_dump(mode="json"),
        config={
            "model": shape.model_dump(mode="json"),
            "layout": resolved.layout.model_dump(mode="json"),
            "plan": stored_plan(resolved),
            # The interval the ranks start with, and whether the service may move it.
            live_interval.CONFIG_KEY: live_interval.initial_config(spec),
            # The groups as planned (pinned, or chosen under fault_tolerance: auto).
            **(
                {
                    "fault_tolerance": {
                        "replica_groups": replica_groups_of(resolved),
                        "min_healthy_groups": spec.min_healthy_groups,
                    }
                }
                if replica_groups_of(resolved) > 1
                else {}
            ),
        },
        num_nodes=spec.nodes,
        gpus_per_node=spec.gpus_per_node,
        min_nodes=spec.min_nodes,
        max_restarts=(
            spec.max_restarts if spec.max_restarts is not None else settings.default_max_restarts
        ),
        num_restarts=0,
        total_steps=spec.steps,
        attempts=[],
    )
    session.add(run)
    session.flush()
    # `runyard plan accuracy`, against the accelerator of the cluster it runs on.
    plan_outcomes.record_prediction(session, run, placement.cluster.accelerator)
    on = f" on cluster {placement.why}" if placement.why else ""
    record_event(
        session,
        run,
        "run.submitted",
        f"run '{run.name}' accepted{on}",
        data={"layout": run.config["layout"]},
    )
    return run


def require_run(
    session: Session, run_id: int, principal: Principal | None = None, *, for_update: bool = False
) -> Run:
    """The run, if it exists and the caller's team may see it (404 either way otherwise)."""
    missing = f"no run with id {run_id}; `runyard run list` shows the runs"
    run = repository.get_run(session, run_id, for_update=for_update)
    if run is None:
        raise NotFound(missing)
    if principal is not None:
        principal.require_team_of(run.team, missing)
    return run


def check_quota(session: Session, team: str, gpus: int) -> None:
    """Refuse a run that would take the team past its GPU quota."""
    row = session.get(Team, team)
    if row is None or row.gpu_quota is None:
        return
    in_use = repository.gpus_in_use(session, team)
    if in_use + gpus > row.gpu_quota:
        raise QuotaExceeded(
            f"team {team} has a quota of {row.gpu_quota} GPUs, {in_use} in use by active runs; "
            f"this run needs {gpus}: cancel a run or ask an admin to raise the quota"
        )


def cancel_run(
    session: Session, run_id: int, principal: Principal | None = None, *, now: bool = False
) -> Run:
    """Mark the run CANCELLING; the reconciler stops its Slurm jobs outside this transaction.

    Ranks already training are first asked to stop (stop_requests.py): they save a
    checkpoint through their own code or framework and exit 0, so a cancelled run keeps
    what it trained; `now` skips that, and ranks still there after `stop_grace_s` are
    scancelled (reconcile/cancellation.py)."""
    run = require_run(session, run_id, principal, for_update=True)
    if principal is not None and principal.is_admin and run.team != principal.team:
        audit(session, principal, "run.cancel", f"run {run.id}", {"team": run.team})
    if run.state.is_terminal:
        raise Conflict(f"run {run_id} already ended ({run.state}); nothing to cancel")
    if run.state == RunState.PENDING and repository.live_attempt(run) is None:
        set_run_state(session, run, RunState.CANCELLED, "cancelled before it was submitted")
        return run
    if run.state != RunState.CANCELLING:
        reason = "cancel requested" + (" (now)" if now else "")
        set_run_state(session, run, RunState.CANCELLING, reason)
    elif now:
        record_event(session, run, "run.cancel_now", "cancel now: the jobs are scancelled")
    # Replica groups stop on a request only where the groups agree on one step, which a
    # cancel does not arrange: their ranks kept training until the grace ran out. Their
    # cancel scancels at once, as before; the groups' last commit stands.
    groups = any(a.replica_group is not None for a in run.attempts)
    saves = RunSpec.model_validate(run.spec).hears_stop_requests and not groups
    for attempt in run.attempts:
        if attempt.state.is_terminal:
            continue
        if now or not saves:  # a request still standing would hold the scancel back for its grace
            attempt.stop_requested_at = None
        elif attempt.state == AttemptState.RUNNING and attempt.stop_requested_at is None:
            request_stop(session, run, attempt, StopReason.CANCELLED)
    return run


def run_out(run: Run, goodput: Goodput | None = None) -> RunOut:
    return RunOut(
        id=run.id,
        name=run.name,
        cluster=run.cluster,
        owner=run.owner,
        team=run.team,
        priority=run.priority,
        state=run.state,
        state_reason=run.state_reason,
        num_nodes=run.num_nodes,
        gpus_per_node=run.gpus_per_node,
        total_steps=run.total_steps,
        last_step=run.last_step,
        last_loss=run.last_loss,
        tokens_per_s=run.tokens_per_s,
        num_restarts=run.num_restarts,
        max_restarts=run.max_restarts,
        created_at=run.created_at,
        started_at=run.started_at,
        ended_at=run.ended_at,
        layout=run.config["layout"],
        model_shape=run.config.get("model"),
        spec=run.spec,
        plan=run.config.get("plan"),
        placement=run.config.get("placement"),
        nodes=run.nodes,
        num_hardware_restarts=run.num_hardware_restarts,
        sweep_id=run.sweep_id,
        sweep_params=run.sweep_params,
        goodput=goodput,
        mfu=achieved_mfu(run.config.get("plan"), run.tokens_per_s),
        attempts=[AttemptOut.model_validate(a) for a in run.attempts],
        rollbacks=run.config.get("rollbacks", []),
    )


def worker_config(
    session: Session, run: Run, attempt: Attempt, settings: Settings
) -> WorkerRunConfig:
    """The resolved config one attempt's ranks train with, resuming where the run stopped."""
    spec = RunSpec.model_validate(run.spec)
    newest = repository.newest_committed_checkpoint(session, run.id)
    replica = None
    planned = run.config.get("fault_tolerance")  # the groups as planned
    if attempt.replica_group is not None and planned is not None:
        replica = ReplicaGroupConfig(
            group=attempt.replica_group,
            groups=planned["replica_groups"],
            min_healthy_groups=planned["min_healthy_groups"],
            lighthouse_addr=run.lighthouse_addr or "",
            timeout_s=settings.replica_timeout_s,
            heal_from_peer=attempt.heals_from_peer,
        )
        # A group that replaces a failed one heals from a live peer, not from disk; every
        # group of a start or a restart from disk loads the step its attempt names (none:
        # from scratch), recovery/fast_path.py.
        if attempt.heals_from_peer or attempt.resume_step is None:
            newest = None
    return WorkerRunConfig(
        run_id=run.id,
        attempt_id=attempt.id,
        attempt_number=attempt.number,
        name=run.name,
        model=ModelShape.model_validate(run.config["model"]),
        layout=ParallelLayout.model_validate(run.config["layout"]),
        seq_len=spec.seq_len,
        global_batch=spec.global_batch,
        steps=spec.steps,
        lr=spec.lr,
        seed=spec.seed,
        checkpoint_every=live_interval.current_every(run.config, spec.checkpoint_every),
        keep_checkpoints=spec.keep_checkpoints,
        checkpoint_dir=str(checkpoint_folder(settings, run)),
        data=spec.data,
        eval_every=spec.eval_every,
        # Each owner's own cache: a user's runs never map files another user packed.
        data_cache_dir=str(owner_root(settings.data_cache_dir, run)),
        resume_from=ResumePoint(step=newest.step, path=newest.path) if newest else None,
        init_from_hf=spec.model.from_hf if isinstance(spec.model, HfModelSpec) else None,
        entrypoint=spec.entrypoint,
        environment=spec.environment,
        progress=spec.progress,
        resume=spec.resume,
        fault_tolerance=replica,
        spike=spec.spike,
        sdc_check_every=spec.sdc_check_every,
        # Every window a rollback skipped, in the order made (service/runs/rollback.py).
        data_skips=[DataSkip.model_validate(s) for s in run.config.get("data_skips", [])],
    )


def run_goodput(session: Session, run: Run) -> Goodput:
    """From the attempts' progress summaries and the checkpoints: no scan of metric rows."""
    return compute_goodput(run, run.attempts, repository.checkpoints(session, run.id))
