"""Submission: a new attempt for every placed PENDING run, and its sbatch.

The attempt is recorded (SUBMITTING, with its unique job name) before sbatch, so a service
that dies in between finds the job by name next time (adoption) instead of queueing it
twice; a worker token is minted only for a fresh submission.

dstack's rule holds throughout the reconciler: no Slurm call while a database transaction
is open. Each step reads what to do in one short transaction, talks to Slurm, then writes
the outcome in another, re-reading rows under lock because they may have moved meanwhile.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session, selectinload

from contract import StopReason
from service.auth.service import create_token
from service.config import Settings
from service.db import session_scope
from service.identity.owner_folders import attempt_folder, checkpoint_folder, owner_roots
from service.identity.service import adopt_owner, owner_of
from service.models import ApiToken, Attempt, AttemptState, Role, Run, RunState, TokenOrigin
from service.models.base import utcnow
from service.recovery import fast_path, incident_timeline, sdc
from service.recovery.fast_path import replica_groups
from service.recovery.restart import set_stop_reason
from service.runs import repository
from service.runs.run_state_machine import record_event, set_attempt_state, set_run_state
from service.runs.schemas import RunSpec
from service.slurm.client import SlurmClient, SlurmError, SlurmUnreachable
from service.slurm.owner import OwnerAccessError, OwnerFailure
from service.slurm.reservations import ensure_reservation
from service.slurm.snapshot import ClusterSnapshot
from service.slurm.submit import AttemptRequest, job_name

log = logging.getLogger(__name__)
# Priority classes on Slurm's side: pending jobs of a lower class queue behind higher ones.
NICE_BY_PRIORITY = {"prod": 0, "research": 100, "scavenger": 1000}


def attempt_request(run: Run, attempt: Attempt, settings: Settings) -> AttemptRequest:
    """What Slurm must give this attempt: the run's nodes, in its own reservation, run as
    its owner and charged to the owner's account."""
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
        owner=owner_of(run, settings),
        checkpoint_folder=checkpoint_folder(settings, run),
        owner_roots=owner_roots(settings, run),
        segment=segment_of(run),
    )


def segment_of(run: Run) -> int | None:
    """The `--segment` placement chose for the run on topology/block (its placement record),
    when the nodes it holds now still split into whole segments."""
    segment = (run.config.get("placement") or {}).get("segment")
    return segment if segment and len(run.nodes) % segment == 0 else None


def submit_pending(settings: Settings, snapshot: ClusterSnapshot, slurm: SlurmClient) -> None:
    """Give every placed PENDING run of `slurm`'s cluster without a live attempt a new one,
    and submit it there."""
    todo: list[AttemptRequest] = []
    with session_scope() as session:
        # Placed runs only, filtered in SQL: 10,000 queued runs must not be loaded per tick.
        # Locked, as cancel_run locks a run: a cancel that read "PENDING, no attempt" and
        # committed CANCELLED between this read and the new attempt's insert would leave a
        # job queued under a cancelled run; now it waits, and sees the attempt.
        placed = session.scalars(
            select(Run)
            .where(Run.state == RunState.PENDING, func.cardinality(Run.nodes) >= Run.num_nodes)
            .where(Run.cluster == slurm.cluster_name)
            .options(selectinload(Run.attempts))
            .order_by(Run.id)
            .with_for_update(of=Run)
        ).all()
        for run in placed:
            if replica_groups(run) > 1:
                continue  # replica groups: recovery/fast_path.py submits one job per group
            attempt = repository.live_attempt(run)
            if attempt is None:
                adopt_owner(session, run)  # accepted before runs had owners
                attempt = new_attempt(session, run, settings)
            if attempt.state == AttemptState.SUBMITTING and attempt.slurm_job_id is None:
                todo.append(attempt_request(run, attempt, settings))
    submit_attempts(slurm, snapshot, todo, settings.slurm_job_prefix, _submission_failed)


def submit_attempts(
    slurm: SlurmClient,
    snapshot: ClusterSnapshot,
    todo: list[AttemptRequest],
    job_prefix: str,
    on_refused: Callable[[AttemptRequest, str], None],
    reservation_nodes: Callable[[AttemptRequest], list[str]] | None = None,
) -> None:
    """sbatch each SUBMITTING attempt once and record its job id (PENDING). A service that
    died between recording SUBMITTING and storing the job id may already have submitted:
    such a job is found by its unique name and adopted instead of submitted twice.
    `on_refused` decides what an sbatch refusal means for the run; `reservation_nodes`,
    which nodes the attempt's reservation must hold (default: the attempt's own)."""
    if not todo:
        return
    try:
        orphans = slurm.jobs_by_name(f"{job_prefix}-")
        orphans = owners_own(slurm, orphans, {r.job_name: r.owner.unix_user for r in todo})
    except SlurmError as exc:
        log.warning("cannot list the queued jobs, submitting next pass: %s", exc)
        return  # submitting blind could queue an attempt twice
    for req in todo:
        try:
            if req.reservation:
                nodes = reservation_nodes(req) if reservation_nodes else req.nodelist.split(",")
                ensure_reservation(
                    slurm, req.reservation, nodes, snapshot.reservations, [req.owner.unix_user]
                )
            job_id = orphans.get(req.job_name)
            if job_id is None:
                # Minted only for a fresh submission: an adopted job already runs on the
                # token written before the crash, and minting revokes it.
                job_id = slurm.submit(req, mint_worker_token(req.run_id, req.attempt_id))
                try:
                    check_submitted(slurm, job_id, req.owner.unix_user, req.job_name)
                except OwnerAccessError:
                    cancel_unrecorded(slurm, req.job_name, req.owner.unix_user)
                    raise
            else:  # the crash may have come between sbatch and submitit's last step
                slurm.finish_submission(req.owner, req.job_folder, {req.attempt_id: job_id})
        except SlurmUnreachable as exc:
            # No answer is not a refusal: the attempt stays SUBMITTING, and the next pass
            # adopts the job by its name if the sbatch did queue it, or submits it again.
            log.warning("%s: Slurm did not answer, trying next pass: %s", req.job_name, exc)
            continue
        except SlurmError as exc:
            on_refused(req, str(exc))
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
            incident_timeline.attempt_submitted(session, owner.id)
        log.info("submitted %s as Slurm job %s", req.job_name, job_id)


def submit_group_attempts(
    settings: Settings, snapshot: ClusterSnapshot, slurm: SlurmClient
) -> None:
    """Every group of a placed replica-group run has a live attempt, and every SUBMITTING
    one is sbatched once (a job found by its unique name after a crash is adopted); the
    runs of `slurm`'s cluster."""
    todo: list[AttemptRequest] = []
    with session_scope() as session:
        # Only runs with a lighthouse: loading every queued run here cost 4 s a tick with
        # 10,000 queued (bench/reconciler_scale.py).
        runs = session.scalars(
            select(Run)
            .where(
                Run.state.in_([RunState.PENDING, RunState.RUNNING]),
                Run.lighthouse_addr.is_not(None),
                Run.cluster == slurm.cluster_name,
            )
            .options(selectinload(Run.attempts))
            .order_by(Run.id)
        ).all()
        for run in runs:
            if replica_groups(run) < 2 or not run.lighthouse_addr:
                continue  # not a replica-group run, or its lighthouse is not up yet
            live = fast_path.live_group_attempts(run)
            if run.state == RunState.PENDING and not live:
                if len(run.nodes) < run.num_nodes:
                    continue  # placement first
                for group in range(replica_groups(run)):
                    live[group] = fast_path.new_group_attempt(
                        session, run, settings, group, from_disk=True
                    )
            elif live:
                # A group without an attempt while others train (it waited for a spare, or
                # a restart in place ended only its job): it comes back healing from them.
                finished = {
                    a.replica_group for a in run.attempts if a.state == AttemptState.SUCCEEDED
                }
                for group in sorted(set(range(replica_groups(run))) - set(live) - finished):
                    if fast_path.spares_granted(session, run, group) and fast_path.group_ready(
                        session, run, group
                    ):
                        live[group] = fast_path.new_group_attempt(
                            session, run, settings, group, from_disk=False
                        )
            for attempt in live.values():
                if attempt.state == AttemptState.SUBMITTING and attempt.slurm_job_id is None:
                    request = attempt_request(run, attempt, settings)
                    todo.append(
                        dataclasses.replace(
                            request,
                            num_nodes=len(attempt.nodes),
                            nodelist=",".join(attempt.nodes),
                            nice=NICE_BY_PRIORITY.get(run.priority, 0),
                            # A group's job runs on its own nodes of the run's reservation,
                            # so it names them (no --segment, which would drop the list).
                            segment=None,
                        )
                    )
    submit_attempts(
        slurm,
        snapshot,
        todo,
        settings.slurm_job_prefix,
        on_refused=lambda req, why: log.warning(
            "group attempt %s: sbatch failed, retrying: %s", req.attempt_id, why
        ),
        reservation_nodes=_run_nodes,  # the run's reservation spans every group's nodes
    )


def _run_nodes(req: AttemptRequest) -> list[str]:
    with session_scope() as session:
        owner = repository.get_run(session, req.run_id)
        return list(owner.nodes) if owner else req.nodelist.split(",")


def owners_own(slurm: SlurmClient, named: dict[str, str], owners: dict[str, str]) -> dict[str, str]:
    """The jobs found by name that run as the attempt's owner. Names and ids are no secret
    (squeue shows them to everyone), so another user could queue a job named like the next
    attempt of someone's run: adopted, it would stand in for that attempt. One batched
    `scontrol show job` for the candidates (there are some only after a crash)."""
    candidates = {name: job for name, job in named.items() if name in owners}
    if not candidates:
        return {}
    details = slurm.job_details(list(candidates.values()))
    kept = {}
    for name, job in candidates.items():
        user = details[job].user if job in details else ""
        if user == owners[name]:
            kept[name] = job
        else:
            log.warning("job %s is named %s but runs as %r, not %r: not adopted", job, name,
                        user, owners[name])  # fmt: skip
    return kept


def check_submitted(slurm: SlurmClient, job_id: str, owner: str, job_name: str) -> None:
    """The job id the owner's program answered with names the job it was asked to queue:
    slurmctld knows it (sbatch answers once slurmctld has the job), it runs as the owner,
    and it carries the attempt's unique name. The answer comes from a process the owner may
    write to, and what is recorded is what the reconciler polls and, with a Slurm
    administrator's rights, cancels: an id of another user's job, or one slurmctld has not
    given out yet (the next job anyone submits takes it), must not become the run's. Raises
    OwnerAccessError (INVALID): the attempt fails, nothing recorded."""
    found = slurm.job_details([job_id]).get(job_id)
    if found is None:
        why = "which slurmctld does not know"
    elif found.user != owner:
        why = f"which runs as {found.user or 'an unknown user'}"
    elif found.name != job_name:
        why = f"which is named {found.name!r}"
    else:
        return
    raise OwnerAccessError(
        OwnerFailure.INVALID,
        f"sbatch as {owner} answered with job {job_id}, {why}, not the attempt's job "
        f"({owner}'s, named {job_name}): not recorded",
    )


def cancel_unrecorded(slurm: SlurmClient, job_name: str, owner: str) -> None:
    """After an answer refused by check_submitted: the job the owner's program may have
    queued under the attempt's name all the same. Nothing records it, so nothing would poll
    or cancel it, and it would hold the run's nodes and reservation. Cancelled as the
    owner's only (scancel --user), whoever else named a job so."""
    try:
        queued = slurm.jobs_by_name(job_name).get(job_name)
        if queued is not None:
            slurm.cancel({queued: owner})
    except SlurmError as exc:
        log.warning("%s: cannot cancel what its refused sbatch queued: %s", job_name, exc)


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
            origin=TokenOrigin.SERVICE,
        )
    return secret


def new_attempt(session: Session, run: Run, settings: Settings) -> Attempt:
    """The run's next attempt, SUBMITTING on the run's nodes, resuming from its newest
    committed checkpoint; its job name is unique, so a crash mid-submit can find it."""
    number = repository.next_attempt_number(run)
    newest = repository.newest_committed_checkpoint(session, run.id)
    sdc.forget_clean_steps_after(run, newest.step if newest else 0)
    attempt = Attempt(
        run_id=run.id,
        number=number,
        state=AttemptState.SUBMITTING,
        job_name="",
        job_folder="",
        cluster=run.cluster,  # the run's nodes and reservation are there
        nodes=list(run.nodes),
        resume_step=newest.step if newest else None,
    )
    session.add(attempt)
    session.flush()
    attempt.job_name = job_name(settings.slurm_job_prefix, run.id, attempt.id)
    attempt.job_folder = str(attempt_folder(settings, run, number))
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
