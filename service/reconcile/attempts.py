"""Reconcile runs and their attempts with Slurm.

dstack's rule holds throughout: no sbatch/squeue/scancel call while a database transaction
is open. Each step reads what to do in one short transaction, talks to Slurm, then writes
the outcome in another, re-reading rows under lock because they may have moved meanwhile.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from contract import ExitCode, StopReason
from service.auth.service import create_token
from service.config import Settings, get_settings
from service.db import session_scope
from service.errors import InvalidSpec
from service.models import (
    ApiToken,
    Attempt,
    AttemptState,
    CheckpointState,
    Node,
    NodeState,
    Role,
    Run,
    RunState,
    Sweep,
)
from service.models.base import utcnow
from service.reconcile.preemption import attempt_stopped
from service.recovery import timeline
from service.recovery.restart import end_attempt_and_restart, set_stop_reason
from service.runs import repository
from service.runs.lifecycle import record_event, set_attempt_state, set_run_state
from service.runs.schemas import RunSpec
from service.runs.service import resolve, run_folder, stored_plan
from service.slurm import commands
from service.slurm.commands import JobStatus, SlurmError
from service.slurm.placement import choose_nodes, placement_cost
from service.slurm.reservations import delete_reservation, ensure_reservation, run_reservation
from service.slurm.snapshot import ClusterSnapshot
from service.slurm.submit import AttemptRequest, job_name, submit_attempt, write_token_file

log = logging.getLogger(__name__)
# Priority classes on Slurm's side: pending jobs of a lower class queue behind higher ones.
NICE_BY_PRIORITY = {"prod": 0, "research": 100, "scavenger": 1000}


def _request(run: Run, attempt: Attempt) -> AttemptRequest:
    spec = RunSpec.model_validate(run.spec)
    return AttemptRequest(
        run_id=run.id,
        attempt_id=attempt.id,
        job_name=attempt.job_name,
        job_folder=Path(attempt.job_folder),
        num_nodes=len(run.nodes),
        ranks_per_node=run.gpus_per_node,
        time_limit_min=spec.time_limit_min,
        nodelist=",".join(run.nodes),
        reservation=run.reservation,
        nice=NICE_BY_PRIORITY.get(run.priority, 0),
    )


def place_pending(settings: Settings, snapshot: ClusterSnapshot) -> None:
    """Give PENDING runs the nodes they lack: free, healthy, fewest leaf switches."""
    with session_scope() as session:
        runs = [
            r
            for r in repository.runs_in_states(session, [RunState.PENDING])
            if repository.needs_placement(r)
        ]
        # Higher priority first; within a class, first come first served.
        runs.sort(key=lambda r: (-repository.PRIORITY_RANK.get(r.priority, 0), r.id))
        if not runs:
            return
        nodes = {n.name: n for n in session.query(Node).all()}
        taken: set[str] = set()
        for run in runs:
            run = repository.get_run(session, run.id, for_update=True) or run
            need = run.num_nodes - len(run.nodes)
            kept_switches = {nodes[n].switch for n in run.nodes if n in nodes}
            free = [
                (n.name, n.switch)
                for n in nodes.values()
                if n.state == NodeState.HEALTHY
                and snapshot.is_free(n.name)
                and n.name not in taken
                and n.name not in run.nodes
            ]
            # Prefer free nodes on the switches the run already sits on.
            near = [f for f in free if f[1] in kept_switches]
            chosen = choose_nodes(near, need) if len(near) >= need else choose_nodes(free, need)
            if chosen is None:
                _wait_for_nodes(session, run, need, len(free))
                continue
            taken.update(chosen)
            _hold_nodes(session, run, [*run.nodes, *chosen], nodes, settings.slurm_job_prefix)


def _hold_nodes(
    session: Session, run: Run, held: list[str], nodes: dict[str, Node], prefix: str
) -> None:
    """The run holds `held` from now on (through its own reservation); record the cost."""
    run.nodes = held
    run.reservation = run_reservation(prefix, run.id)
    layout = run.config["layout"]
    cost = placement_cost(
        run.nodes,
        {n: nodes[n].switch for n in run.nodes if n in nodes},
        ranks_per_node=run.gpus_per_node,
        tp=layout["tp"],
        cp=layout["cp"],
        pp=layout["pp"],
    )
    run.config = {**run.config, "placement": {"nodes": run.nodes, **cost}}
    record_event(
        session,
        run,
        "run.placed",
        f"nodes {', '.join(run.nodes)}: {cost['switches_spanned']} leaf switch(es), "
        f"{cost['cross_switch_pipeline_edges']} cross-switch pipeline edge(s)",
        data={
            "nodes": run.nodes,
            **cost,
            "switches": sorted({nodes[n].switch or "-" for n in run.nodes}),
        },
    )


def adopt_array_nodes(session: Session, run: Run, allocated: list[str]) -> None:
    """Slurm placed a sweep's array task: from here on the run holds those nodes like any
    other run, so a failure is recovered onto a spare and retries keep the healthy nodes."""
    nodes = {n.name: n for n in session.scalars(select(Node).where(Node.name.in_(allocated)))}
    _hold_nodes(session, run, list(allocated), nodes, get_settings().slurm_job_prefix)


def _wait_for_nodes(session: Session, run: Run, need: int, free: int) -> None:
    if run.min_nodes and run.nodes and run.min_nodes <= len(run.nodes):
        # The run allows fewer nodes and checkpoints reshard: continue on what is left.
        spec = RunSpec.model_validate({**run.spec, "nodes": len(run.nodes), "min_nodes": None})
        try:
            _, resolved = resolve(spec)
        except InvalidSpec as exc:
            reason = f"cannot shrink to {len(run.nodes)} nodes ({exc.detail}); waiting"
        else:
            old, layout = run.num_nodes, resolved.layout
            run.num_nodes = len(run.nodes)
            run.config = {
                **run.config,
                "layout": layout.model_dump(mode="json"),
                "plan": stored_plan(resolved),
            }
            record_event(
                session,
                run,
                "run.shrunk",
                f"no node to replace a failed one: continuing on {run.num_nodes} "
                f"nodes instead of {old} (min_nodes {run.min_nodes}), "
                f"dp {layout.dp}",
                data={"layout": run.config["layout"]},
            )
            return
    else:
        reason = f"waiting for {need} free healthy node(s); {free} free now"
    if run.state_reason != reason:
        run.state_reason = reason
        record_event(session, run, "run.waiting", reason)


def submit_pending(settings: Settings, snapshot: ClusterSnapshot) -> None:
    """Give every placed PENDING run without a live attempt a new one, and submit it."""
    todo: list[AttemptRequest] = []
    with session_scope() as session:
        for run in repository.runs_in_states(session, [RunState.PENDING]):
            if len(run.nodes) < run.num_nodes:
                continue
            attempt = repository.live_attempt(run)
            if attempt is None:
                attempt = new_attempt(session, run, settings)
            if attempt.state == AttemptState.SUBMITTING and attempt.slurm_job_id is None:
                todo.append(_request(run, attempt))
    if not todo:
        return
    # A service that died between recording SUBMITTING and storing the job id may already
    # have submitted: find such jobs by their unique name instead of submitting twice.
    try:
        orphans = commands.jobs_by_name(f"{settings.slurm_job_prefix}-")
    except SlurmError as exc:
        log.warning("cannot list the queued jobs, submitting next pass: %s", exc)
        return  # submitting blind could queue an attempt twice
    for req in todo:
        try:
            if req.reservation:
                ensure_reservation(req.reservation, req.nodelist.split(","), snapshot.reservations)
            job_id = orphans.get(req.job_name)
            if job_id is None:
                # Minted only for a fresh submission: an adopted job already runs on the
                # token written before the crash, and minting revokes it.
                write_token_file(req.token_file, mint_worker_token(req.run_id, req.attempt_id))
                job_id = submit_attempt(req, settings)
        except SlurmError as exc:
            _submission_failed(req, str(exc))
            continue
        with session_scope() as session:
            locked = repository.lock_run_and_attempt(session, req.attempt_id)
            if locked is None or locked[1].state != AttemptState.SUBMITTING:
                continue
            owner, attempt = locked
            attempt.slurm_job_id, attempt.submitted_at = job_id, utcnow()
            set_attempt_state(
                session,
                owner,
                attempt,
                AttemptState.PENDING,
                f"Slurm job {job_id} queued on {req.nodelist}",
            )
            timeline.attempt_submitted(session, owner.id)
        log.info("submitted %s as Slurm job %s", req.job_name, job_id)


def mint_worker_token(run_id: int, attempt_id: int) -> str:
    """A token valid for this attempt only; it dies with the attempt (see auth/deps.py).
    Earlier ones for the same attempt (a submission retried after a crash) are revoked."""
    with session_scope() as session:
        run = repository.get_run(session, run_id)
        assert run is not None
        for old in session.scalars(
            select(ApiToken).where(ApiToken.attempt_id == attempt_id, ApiToken.revoked_at.is_(None))
        ):
            old.revoked_at = utcnow()
        _, secret = create_token(
            session,
            user=run.owner or "runyard",
            team=run.team or "runyard",
            role=Role.WORKER,
            run_id=run.id,
            attempt_id=attempt_id,
        )
    return secret


def new_attempt(session: Session, run: Run, settings: Settings) -> Attempt:
    number = len(run.attempts) + 1
    newest = repository.newest_committed_checkpoint(session, run.id)
    attempt = Attempt(
        run_id=run.id,
        number=number,
        state=AttemptState.SUBMITTING,
        job_name="",
        job_folder="",
        nodes=list(run.nodes),
        resume_step=newest.step if newest else None,
    )
    session.add(attempt)
    session.flush()
    attempt.job_name = job_name(settings.slurm_job_prefix, run.id, attempt.id)
    attempt.job_folder = str(settings.jobs_dir / run_folder(run) / f"attempt-{number:03d}")
    resume = f"resuming from step {newest.step}" if newest else "starting from scratch"
    record_event(
        session,
        run,
        "attempt.submitting",
        f"attempt {number}: submitting, {resume}",
        attempt,
        {"resume_step": attempt.resume_step, "nodes": run.nodes},
    )
    session.flush()
    return attempt


def _submission_failed(req: AttemptRequest, reason: str) -> None:
    with session_scope() as session:
        locked = repository.lock_run_and_attempt(session, req.attempt_id)
        if locked is None or locked[1].state.is_terminal:
            return
        run, attempt = locked
        set_stop_reason(attempt, StopReason.SUBMISSION_FAILED)
        set_attempt_state(session, run, attempt, AttemptState.FAILED, reason)
        set_run_state(session, run, RunState.FAILED, f"submission failed: {reason}", attempt)


def stop_cancelling() -> None:
    """scancel the jobs of CANCELLING runs; once they left the queue, the run is CANCELLED."""
    targets: dict[int, list[str]] = {}
    unnamed: dict[int, list[str]] = {}  # run -> names of jobs maybe queued before a crash
    with session_scope() as session:
        for r in repository.runs_in_states(session, [RunState.CANCELLING]):
            live = [a for a in r.attempts if not a.state.is_terminal]
            targets[r.id] = [a.slurm_job_id for a in live if a.slurm_job_id]
            for a in live:
                if a.slurm_job_id is not None or a.state != AttemptState.SUBMITTING:
                    continue
                sweep = session.get(Sweep, r.sweep_id) if r.sweep_id else None
                if sweep is None or a.id not in sweep.array_attempt_ids:
                    unnamed.setdefault(r.id, []).append(a.job_name)
                elif sweep.submitted_at is None:
                    # Its task's job id comes with the array (sweeps.py); until then the
                    # run stays CANCELLING, so the task cannot be forgotten.
                    del targets[r.id]
                    break
    if unnamed:
        try:
            queued = commands.jobs_by_name(f"{get_settings().slurm_job_prefix}-")
        except SlurmError as exc:
            log.warning("cannot list the queued jobs, cancelling next pass: %s", exc)
            queued = None
        for run_id, names in unnamed.items():
            if queued is None:
                targets.pop(run_id, None)
            elif run_id in targets:
                targets[run_id] += [queued[n] for n in names if n in queued]
    job_ids = [job for jobs in targets.values() for job in jobs]
    for job in job_ids:
        commands.scancel(job)
    still_live = commands.squeue(job_ids)
    for run_id, jobs in targets.items():
        if any(job in still_live and still_live[job].is_live for job in jobs):
            continue
        with session_scope() as session:
            run = repository.get_run(session, run_id, for_update=True)
            if run is None or run.state != RunState.CANCELLING:
                continue
            for attempt in run.attempts:
                if not attempt.state.is_terminal:
                    set_stop_reason(attempt, StopReason.CANCELLED)
                    set_attempt_state(
                        session, run, attempt, AttemptState.CANCELLED, "cancelled by the user"
                    )
            set_run_state(session, run, RunState.CANCELLED, "cancelled by the user")


def release_ended_runs(snapshot: ClusterSnapshot) -> None:
    """Delete the reservation of every run that ended, giving its nodes back."""
    with session_scope() as session:
        ended = [
            (r.id, r.reservation)
            for r in repository.runs_in_states(
                session, [RunState.SUCCEEDED, RunState.FAILED, RunState.CANCELLED]
            )
            if r.reservation
        ]
    for run_id, name in ended:
        assert name is not None
        delete_reservation(name, snapshot.reservations)
        with session_scope() as session:
            run = repository.get_run(session, run_id, for_update=True)
            if run is not None:
                run.reservation = None
                record_event(session, run, "run.released", f"nodes released ({name})")


@dataclass(frozen=True)
class _Observed:
    attempt_id: int
    status: JobStatus | None  # None: slurmctld forgot the job
    nodes: list[str]


def poll_attempts() -> None:
    """Read every queued or running attempt's job in one squeue call and act on changes."""
    with session_scope() as session:
        watched = [
            (a.id, a.slurm_job_id)
            for run in repository.runs_in_states(session, [RunState.PENDING, RunState.RUNNING])
            for a in run.attempts
            if a.state in (AttemptState.PENDING, AttemptState.RUNNING) and a.slurm_job_id
        ]
    if not watched:
        return
    live = commands.squeue([job for _, job in watched if job])
    observed = []
    for attempt_id, job in watched:
        assert job is not None
        status = live.get(job) or commands.show_job(job)
        nodes = commands.expand_hostlist(status.node_list) if status and status.node_list else []
        observed.append(_Observed(attempt_id, status, nodes))
    for obs in observed:
        with session_scope() as session:
            _apply(session, obs)


def _apply(session: Session, obs: _Observed) -> None:
    locked = repository.lock_run_and_attempt(session, obs.attempt_id)
    if locked is None or locked[1].state.is_terminal:
        return
    run, attempt = locked
    assert run is not None
    if run.state not in (RunState.PENDING, RunState.RUNNING):
        return  # cancel owns it now
    status = obs.status
    if status is not None and obs.nodes:
        attempt.node_list, attempt.nodes = status.node_list, obs.nodes
        if run.sweep_id is not None and not run.nodes:
            adopt_array_nodes(session, run, obs.nodes)
    if status is not None and status.is_live:
        if status.state == "RUNNING" and attempt.state == AttemptState.PENDING:
            set_attempt_state(session, run, attempt, AttemptState.RUNNING, f"on {status.node_list}")
            timeline.attempt_running(session, run.id)
        if status.state == "RUNNING" and run.state == RunState.PENDING:
            set_run_state(
                session, run, RunState.RUNNING, f"attempt {attempt.number} running", attempt
            )
        return
    _attempt_ended(session, run, attempt, status)


def _attempt_ended(session: Session, run: Run, attempt: Attempt, status: JobStatus | None) -> None:
    """The job left Slurm: succeed only if the worker said it finished; else maybe restart."""
    slurm_state = status.state if status else "UNKNOWN (slurmctld forgot the job)"
    exit_code = status.exit_code if status else None
    # A rank may have said so before exiting (workers/service.py): Slurm's code may be 1.
    do_not_retry = attempt.do_not_retry or exit_code == ExitCode.DO_NOT_RETRY
    asked_to_yield = attempt.stop_requested_at is not None and (
        attempt.stop_reason is not None and attempt.stop_reason.is_yield
    )
    if asked_to_yield and exit_code == 0 and not do_not_retry and run.final_step != run.total_steps:
        # We asked it to stop and it left cleanly after its checkpoint: a yield, not a failure.
        attempt_stopped(session, run, attempt, f"Slurm job {slurm_state}")
        return
    final = repository.get_checkpoint(session, run.id, run.total_steps)
    finished = (
        run.final_step == run.total_steps
        and final is not None
        and final.state in (CheckpointState.COMMITTED, CheckpointState.DELETED)
    )
    if finished:
        set_stop_reason(attempt, StopReason.COMPLETED)
        set_attempt_state(
            session, run, attempt, AttemptState.SUCCEEDED, f"Slurm job {slurm_state}", exit_code
        )
        if run.state == RunState.PENDING:
            set_run_state(session, run, RunState.RUNNING, "finished before it was seen running")
        set_run_state(
            session,
            run,
            RunState.SUCCEEDED,
            f"trained {run.total_steps} steps; final checkpoint committed",
            attempt,
        )
        return
    # Exit codes lie: a job can end COMPLETED after a rank gave up. Only the worker's
    # report of its final step counts as success.
    reason = f"Slurm job {attempt.slurm_job_id} ended {slurm_state}"
    reason += f" with exit code {exit_code}" if exit_code is not None else ""
    if run.final_step is None and slurm_state == "COMPLETED":
        reason += " before the worker reported its final step"
    cause = StopReason.DO_NOT_RETRY if do_not_retry else StopReason.JOB_FAILED
    end_attempt_and_restart(session, run, attempt, reason, cause=cause, exit_code=exit_code)
