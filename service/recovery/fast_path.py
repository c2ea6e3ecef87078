"""The fast recovery path: a replica-group run loses one group's job, not the run.

A run with `fault_tolerance.replica_groups` G trains as G Slurm jobs, one attempt row per
group (`attempts.replica_group`), separate jobs rather than one array: each group's job
carries its own node list inside the run's reservation, and a replacement goes to a named
spare, which an array task cannot ask for. When a node fails, the incident (recovery/
incidents.py -> move_to_spare.py) hands a replica-group run to `move_group_to_spare`,
which asks `paths.choose_recovery_path`:
- FAST: only the failed group's attempt ends; a spare takes its node in the run's node
  list; a replacement attempt for that group (no resume step: it heals from a live peer)
  is recorded SUBMITTING in the same transaction. The run stays RUNNING; the other groups
  never stop. The reconciler then sbatches it (reconcile/submission.py
  `submit_group_attempts`, adopting by job name after a crash).
- CLASSIC: every group's attempt ends and the run goes back to PENDING; the next attempts
  (one per group) resume from the newest committed checkpoint on disk.
Every decision is committed before the Slurm call it leads to, and every step reads what is
left to do from Postgres, so a service killed anywhere finishes the recovery exactly once.
Jobs of attempts that ended are scancelled by `recovery/ended_jobs.py` from what Postgres
says, whichever path ended them.
"""

from __future__ import annotations

import logging

from sqlalchemy import select
from sqlalchemy.orm import Session

from contract import StopReason
from planner import reliability
from service.config import Settings
from service.identity.owner_folders import attempt_folder
from service.models import (
    Attempt,
    AttemptState,
    CheckpointState,
    ClassicBecause,
    Incident,
    IncidentState,
    NodeState,
    RecoveryPath,
    Run,
    RunState,
)
from service.nodes import repository as nodes_repo
from service.nodes.node_state_machine import node_event, set_node_state
from service.recovery import sdc, spares
from service.recovery.paths import choose_recovery_path
from service.recovery.restart import end_attempt_and_restart, set_stop_reason
from service.runs import repository, rollback
from service.runs.run_state_machine import record_event, set_attempt_state, set_run_state
from service.slurm.node_choice import choose_replacement
from service.slurm.submit import job_name

log = logging.getLogger(__name__)
LIVE = (AttemptState.SUBMITTING, AttemptState.PENDING, AttemptState.RUNNING)


def replica_groups(run: Run) -> int:
    ft = run.config.get("fault_tolerance")
    return int(ft["replica_groups"]) if ft else 1


def min_healthy_groups(run: Run) -> int:
    ft = run.config.get("fault_tolerance")
    return int(ft["min_healthy_groups"]) if ft else 1


def group_nodes(run: Run, group: int) -> list[str]:
    """Group g trains on its slice of the run's node list (a spare takes the failed node's
    place in it, so the slices stay put)."""
    per = run.num_nodes // replica_groups(run)
    return list(run.nodes[group * per : (group + 1) * per])


def live_group_attempts(run: Run) -> dict[int, Attempt]:
    return {
        a.replica_group: a for a in run.attempts if a.state in LIVE and a.replica_group is not None
    }


def _lost(session: Session, cluster: str, names: list[str]) -> set[str]:
    """Of `cluster`'s `names`, the nodes their group cannot train on: not healthy, or
    failed with their recovery not yet run (a leaf switch's nodes report together, their
    incidents are handled one by one). Two queries whatever the number of nodes."""
    usable = {
        n.name
        for n in nodes_repo.get_nodes(session, cluster, names)
        if n.state in (NodeState.HEALTHY, NodeState.SUSPECT)
    }
    pending = session.scalars(
        select(Incident.node_name).where(
            Incident.cluster == cluster,
            Incident.node_name.in_(names),
            Incident.state == IncidentState.OPEN,
            Incident.attempt_ended_at.is_(None),
        )
    ).all()
    return (set(names) - usable) | {n for n in pending if n is not None}


def spares_granted(session: Session, run: Run, group: int, failed: str | None = None) -> bool:
    """Whether the spare policy lets `group` take spares now (spares.spares_to_grant, the
    function the failure simulation calls): whole groups only, and a group that lost several
    nodes at once (a leaf switch) only if the pool keeps the reserve for the independent
    failures expected before its nodes are back; until then it waits while the others
    train. `failed` is a node being drained in this transaction. A group lacking no node
    needs no grant."""
    lost = _lost(session, run.cluster, list(run.nodes)) | ({failed} if failed else set())
    missing = {
        g: sum(1 for name in group_nodes(run, g) if name in lost)
        for g in range(replica_groups(run))
    }
    if not missing.get(group):
        return True
    gpus = run.num_nodes * run.gpus_per_node
    reserve = spares.reserve_for(reliability.DEFAULT_FAILURES_PER_GPU_HOUR * gpus)
    available = len(spares.spare_nodes(session, run.cluster))
    lacking = {g: n for g, n in missing.items() if n}
    return group in spares.spares_to_grant(lacking, available, reserve, others_train=True)


def new_group_attempt(
    session: Session, run: Run, settings: Settings, group: int, *, from_disk: bool
) -> Attempt:
    """A SUBMITTING attempt for one group: from the newest committed checkpoint when every
    group starts (`from_disk`), else (a replacement) with no resume step: it heals."""
    newest = repository.newest_committed_checkpoint(session, run.id) if from_disk else None
    if from_disk:  # every group restarts there: a new timeline (a replacement heals instead)
        sdc.forget_clean_steps_after(run, newest.step if newest else 0)
    number = repository.next_attempt_number(run)
    attempt = Attempt(
        run_id=run.id,
        number=number,
        state=AttemptState.SUBMITTING,
        job_name="",
        job_folder="",
        cluster=run.cluster,
        nodes=group_nodes(run, group),
        resume_step=newest.step if newest else None,
        replica_group=group,
        heals_from_peer=not from_disk,
    )
    session.add(attempt)
    session.flush()
    run.attempts.append(attempt)
    attempt.job_name = job_name(settings.slurm_job_prefix, run.id, attempt.id)
    attempt.job_folder = str(attempt_folder(settings, run, number))
    how = (
        f"resuming from step {newest.step}"
        if newest
        else ("healing from a live group" if not from_disk else "starting from scratch")
    )
    record_event(
        session,
        run,
        "attempt.submitting",
        f"attempt {number} (replica group {group}): submitting, {how}",
        attempt,
        {"resume_step": attempt.resume_step, "nodes": attempt.nodes, "replica_group": group},
    )
    return attempt


def group_ready(session: Session, run: Run, group: int) -> bool:
    """Whether a group's nodes can take its job; a failed one is swapped for a spare now
    if the pool has one (the run waited for it)."""
    nodes = group_nodes(run, group)
    lost = _lost(session, run.cluster, nodes)
    for name in [n for n in nodes if n in lost]:
        incident = session.scalars(
            select(Incident)
            .where(Incident.run_id == run.id, Incident.node_name == name)
            .order_by(Incident.id.desc())
            .limit(1)
        ).first()
        if incident is None or _take_spare(session, run, incident, name) is None:
            return False
        record_event(
            session,
            run,
            "recovery.spare_assigned",
            f"spare {incident.spare_node} replaces {name} in replica group {group}",
            data={"incident": incident.id, "failed": name, "spare": incident.spare_node},
        )
    return True


def _take_spare(session: Session, run: Run, incident: Incident, bad: str) -> str | None:
    """Swap `bad` for a spare in the run's node list (same leaf switch first)."""
    remaining = [n for n in run.nodes if n != bad]
    nodes = nodes_repo.get_nodes(session, run.cluster, remaining)
    pool = spares.spare_nodes(session, run.cluster, for_update=True)
    pick = choose_replacement([(s.name, s.switch) for s in pool], {n.switch for n in nodes})
    if pick is None:
        return None
    spare = next(s for s in pool if s.name == pick)
    set_node_state(session, spare, NodeState.HEALTHY, f"spare taken by run {run.id}")
    node_event(session, spare, "spare.assigned", f"replaces {bad} in run {run.id}")
    run.nodes = [pick if n == bad else n for n in run.nodes]
    incident.spare_node = pick
    return pick


def _is_live_copy(attempt: Attempt) -> bool:
    """A group holds a live copy of the state unless it is a replacement still healing."""
    return attempt.first_step is not None or not attempt.heals_from_peer


def move_group_to_spare(session: Session, run: Run, incident: Incident, bad: str) -> list[str]:
    """A node of a replica-group run failed: the fast path if the policy allows, else the
    classic one. Returns the Slurm jobs to scancel once this transaction committed."""
    groups = replica_groups(run)
    failed = run.nodes.index(bad) // (run.num_nodes // groups) if bad in run.nodes else None
    live = live_group_attempts(run)
    healthy = {g for g, a in live.items() if g != failed and _is_live_copy(a)}
    path, why = _recovery_path_for(session, run, incident, live, healthy, failed)
    incident.run_id = incident.run_id or run.id
    incident.recovery_path, incident.classic_because = path, why
    if path == RecoveryPath.FAST and failed is not None:
        return _fast_path(session, run, incident, bad, failed, live.get(failed), healthy)
    return _classic_path(session, run, incident, bad, live, why)


def _recovery_path_for(
    session: Session,
    run: Run,
    incident: Incident,
    live: dict[int, Attempt],
    healthy: set[int],
    failed: int | None,
) -> tuple[RecoveryPath, ClassicBecause | None]:
    """The policy's path (paths.choose_recovery_path) for the groups that hold no live copy
    of the state, unless the incident is an SDC report that no majority outvoted: then
    every group stops for the comparison's rollback, and so they do when the run's restarts
    are spent, which the report uses (the rollback's path fails the run)."""
    groups = replica_groups(run)
    failed_groups = set(range(groups)) - healthy
    path, why = choose_recovery_path(
        replica_groups=groups,
        failed_groups=failed_groups or {failed or 0},
        min_healthy_groups=min_healthy_groups(run),
    )
    # An SDC report whose attempt is still live is this incident's to count (its job's end
    # may have been judged first: judge_group_ended counted it then).
    spent = run.num_restarts - run.num_hardware_restarts >= run.max_restarts and any(
        a.id == incident.attempt_id for a in live.values()
    )
    if incident.signal == sdc.SIGNAL and (not sdc.outvoted_by_majority(session, incident) or spent):
        # no majority: every group stopped for the comparison's rollback (or the run's
        # restarts are spent, which an SDC report uses: the rollback's path fails the run)
        path, why = RecoveryPath.CLASSIC, ClassicBecause.ROLLBACK
    return path, why


def _fast_path(
    session: Session,
    run: Run,
    incident: Incident,
    bad: str,
    failed: int,
    attempt: Attempt | None,
    healthy: set[int],
) -> list[str]:
    """Only group `failed` stops (its live `attempt`, if any): a spare takes `bad`'s place
    if the spare policy grants one, and the group's replacement attempt, healing from a
    live peer, is recorded in this transaction; without a spare the incident WAITs while
    the `healthy` groups train on. Returns the Slurm jobs to scancel."""
    jobs = _end_failed_group(session, run, incident, bad, attempt)
    granted = spares_granted(session, run, failed, bad)
    spare = _take_spare(session, run, incident, bad) if granted else None
    record_event(
        session,
        run,
        "recovery.fast_path",
        f"{bad} drained ({incident.signal}); replica group {failed} "
        + (f"moves to spare {spare}" if spare else "waits for a spare")
        + f"; groups {sorted(healthy)} keep training",
        data={"incident": incident.id, "failed": bad, "spare": spare, "group": failed},
    )
    # The group's other lost nodes (a leaf switch) take theirs in the same pass.
    if spare is not None and group_ready(session, run, failed):
        from service.config import get_settings

        new_group_attempt(session, run, get_settings(), failed, from_disk=False)
    else:  # the others train on; reconcile/submission.py swaps in a spare when one frees
        incident.state = IncidentState.WAITING
    return jobs


def _end_failed_group(
    session: Session, run: Run, incident: Incident, bad: str, attempt: Attempt | None
) -> list[str]:
    """End the failed group's live `attempt` (None when the group has none) and count its
    restart, unless it was counted already: an incident naming an attempt whose end was
    judged first (judge_group_ended counted it) leaves the group's live attempt, a
    replacement, only moved. An outvoted SDC reporter's checkpoints since its comparison
    are distrusted first. Returns the Slurm jobs to scancel."""
    jobs: list[str] = []
    # The attempt the signal was about: an SDC report names its own. Ended already (its
    # job's end was judged first: judge_group_ended replaced it, or left the group to
    # this incident), its restart is counted; a replacement on the node is only moved.
    named = incident.attempt_id
    counts = attempt is not None and named in (None, attempt.id)
    reporter = session.get(Attempt, named) if named is not None else None
    report = sdc.report_of(session, reporter) if reporter is not None else None
    if report is not None and reporter is not None:  # outvoted: what it wrote since
        sdc.distrust_checkpoints_of(session, run, reporter, report)
    if attempt is not None:
        incident.attempt_id = named if named is not None else attempt.id
        cause = StopReason.SDC if report and counts else StopReason.NODE_FAILURE
        set_stop_reason(attempt, cause)
        set_attempt_state(
            session, run, attempt, AttemptState.FAILED, f"node {bad} failed: {incident.signal}"
        )
        jobs += [attempt.slurm_job_id] if attempt.slurm_job_id else []
    if counts:
        # A failed node is the cluster's; an SDC verdict is the run's own claim
        # (recovery/claims.py): one of its max_restarts.
        run.num_hardware_restarts += 0 if incident.signal == sdc.SIGNAL else 1
        run.num_restarts += 1
    return jobs


def _classic_path(
    session: Session,
    run: Run,
    incident: Incident,
    bad: str,
    live: dict[int, Attempt],
    why: ClassicBecause | None,
) -> list[str]:
    """Every group stops and the run restarts from disk (`why` says what ruled out the
    fast path). The restart is decided on one live attempt, left live for it: the one an
    SDC report came from (so the rollback past its comparison, and its count against
    max_restarts, are decided: restart.py), else the first group's. A spare takes `bad`'s
    place, or the run's node list drops it. Returns the Slurm jobs to scancel."""
    jobs: list[str] = []
    lead = next(iter(a for _, a in sorted(live.items())), None)
    if incident.signal == sdc.SIGNAL:
        lead = next((a for a in live.values() if a.id == incident.attempt_id), None)
    for _, attempt in sorted(live.items()):
        jobs += [attempt.slurm_job_id] if attempt.slurm_job_id else []
        incident.attempt_id = incident.attempt_id or attempt.id
        if attempt is not lead:
            set_stop_reason(attempt, StopReason.NODE_FAILURE)
            set_attempt_state(session, run, attempt, AttemptState.FAILED, f"node {bad} failed")
    if lead is not None:
        end_attempt_and_restart(
            session,
            run,
            lead,
            f"node {bad} failed: {incident.signal}",
            cause=StopReason.NODE_FAILURE,
        )
    spare = _take_spare(session, run, incident, bad)
    if spare is None and bad in run.nodes:
        run.nodes = [n for n in run.nodes if n != bad]
    record_event(
        session,
        run,
        "recovery.classic_path",
        f"{bad} drained ({incident.signal}); every group restarts from disk ({why})",
        data={"incident": incident.id, "failed": bad, "spare": spare, "because": str(why)},
    )
    return jobs


def judge_group_ended(
    session: Session, run: Run, attempt: Attempt, status_state: str, exit_code: int | None
) -> None:
    """One group's job left Slurm. The run succeeds when its last group ends after the final
    step was reported and committed; a group that failed alone is replaced (fast path) while
    others train, else the run restarts from disk (classic path)."""
    others = {g: a for g, a in live_group_attempts(run).items() if a.id != attempt.id}
    final = repository.get_checkpoint(session, run.id, run.total_steps)
    done = (CheckpointState.COMMITTED, CheckpointState.DELETED)
    finished = run.final_step == run.total_steps and final is not None and final.state in done
    group = attempt.replica_group
    reason = f"Slurm job {attempt.slurm_job_id} of replica group {group} ended {status_state}"
    # A group that trained the last step and left cleanly is done, even if the writing group
    # has not reported the final checkpoint yet: it is not replaced.
    trained_all = exit_code == 0 and (attempt.last_step or 0) >= run.total_steps
    if finished or trained_all:
        set_stop_reason(attempt, StopReason.COMPLETED)
        set_attempt_state(
            session, run, attempt, AttemptState.SUCCEEDED, f"Slurm job {status_state}", exit_code
        )
        if others:
            return  # the last group to leave decides
        if not finished:  # every group left, the final checkpoint never committed
            end_attempt_and_restart(session, run, attempt, reason, cause=StopReason.JOB_FAILED)
            return
        if run.state == RunState.PENDING:
            set_run_state(session, run, RunState.RUNNING, "finished before it was seen running")
        set_run_state(session, run, RunState.SUCCEEDED, f"trained {run.total_steps} steps", attempt)
        return
    healthy = {g for g, a in others.items() if _is_live_copy(a)}
    groups = replica_groups(run)
    assert attempt.replica_group is not None
    path, _ = choose_recovery_path(
        replica_groups=groups,
        failed_groups=set(range(groups)) - healthy,
        min_healthy_groups=min_healthy_groups(run),
    )
    software_restarts = run.num_restarts - run.num_hardware_restarts
    # A group that stopped for a loss spike or for replicas that disagreed: every group
    # sees the same losses and the same comparison, so every group stops, and the run
    # rolls back from disk (restart.py) as a run without groups does.
    sdc_report = sdc.report_of(session, attempt)
    for_rollback = rollback.anomaly_of(session, attempt) is not None or (
        sdc_report is not None and not sdc_report.get("outvoted")
    )
    if sdc_report is not None and not for_rollback:
        sdc.distrust_checkpoints_of(session, run, attempt, sdc_report)
    # An outvoted group (its SDC incident drains its node) is replaced like a failed one,
    # and like any report-caused drain it is one of the run's max_restarts (claims.py).
    outvoted = sdc_report is not None
    if path == RecoveryPath.FAST and software_restarts < run.max_restarts and not for_rollback:
        set_stop_reason(attempt, StopReason.SDC if outvoted else StopReason.JOB_FAILED)
        set_attempt_state(session, run, attempt, AttemptState.FAILED, reason, exit_code)
        run.num_restarts += 1
        if outvoted and _lost(session, run.cluster, group_nodes(run, attempt.replica_group)):
            # Its node's SDC incident is still to drain it: the replacement is made on the
            # spare that incident takes (move_group_to_spare, counting nothing again).
            return
        from service.config import get_settings

        new_group_attempt(session, run, get_settings(), attempt.replica_group, from_disk=False)
        return
    for other in others.values():  # their jobs are scancelled by ended_jobs.py
        set_stop_reason(other, StopReason.JOB_FAILED)
        set_attempt_state(
            session, run, other, AttemptState.FAILED, f"{reason}: restarting from disk"
        )
    end_attempt_and_restart(
        session, run, attempt, reason, cause=StopReason.JOB_FAILED, exit_code=exit_code
    )
