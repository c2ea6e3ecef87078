"""Failover between clusters, acted on: a run whose cluster cannot run it continues on
another cluster from its last trusted checkpoint.

Each tick, once over every configured cluster (a silent cluster is exactly the one whose
per-cluster steps do not run), the runs `stranded_runs` lists are judged by the failover
rule (service/clusters/failover.py): stay while the ranks still report (Slurm's jobs
outlive their slurmctld), wait up to the site's limit, then move. Which cluster takes the
run is placement's own rule (service/clusters/choice.py, through runs/cluster_placement.py),
asked among the clusters the failover rule's `fits` admits: the run is planned again on
each, so a cluster of other GPUs gets a resharded layout (the ranks load the checkpoint
into it, as after a shrink); on the same hardware the layout is kept, and the steps trained
again give the same losses.

The checkpoint is not copied: a run moves only to a cluster that mounts the folder of its
last trusted (COMMITTED) checkpoint at the same path (the cluster's `mounts` in the clusters
file; unset, one filesystem shared by all). That is checked before the move, and the ranks
on the new cluster verify the checkpoint's checksums when they load it, as at every resume
(a corrupt one falls back to the one before: recovery/checkpoints.py).

The move is one transaction: the live attempts end FAILED (`cluster_failover`, a hardware
restart, none of max_restarts), the run lets go of its nodes and reservation on the old
cluster and is PENDING on the new one, an incident (FAIL_OVER) records what the wait cost
and what the move throws away, and placement and submission on the new cluster take it from
there. Nothing is sent to the silent cluster: when it answers again, the old attempt's job
is cancelled there by the step that cancels the jobs of ended attempts
(recovery/ended_jobs.py), its reservation is swept as one its run no longer holds
(reconcile/placement.py), and a rank that still reports is refused (its attempt ended):
no second copy of the run trains.

A run whose spec pins its cluster stays on it (the user chose that cluster), and so does a
sweep's member (its sweep is one job array on one cluster).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from sqlalchemy.orm import Session

from contract import ModelShape, StopReason
from planner.resolve import Resolved
from service.clusters import registry
from service.clusters.choice import choose_cluster
from service.clusters.failover import (
    FailoverAction,
    FailoverDecision,
    FailoverReason,
    OtherCluster,
    RunCluster,
    decide,
    failover_limit_s,
)
from service.clusters.reachability import Reachability, reachability
from service.clusters.repository import PlacementCounts, placement_counts
from service.clusters.stranded import RUNS_THAT_NEED_A_CLUSTER, StrandedRun, stranded_runs
from service.config import Settings
from service.config_areas.clusters import ClusterConfig
from service.db import session_scope
from service.models import Attempt, AttemptState, Checkpoint, RecoveryAction, Run, RunState
from service.models.base import utcnow
from service.recovery.restart import end_attempt_and_restart, set_stop_reason
from service.recovery.signals import open_incident
from service.runs import repository
from service.runs.cluster_placement import plan_on, read_facts
from service.runs.planning import stored_plan
from service.runs.run_state_machine import record_event, set_attempt_state
from service.runs.schemas import RunSpec

log = logging.getLogger(__name__)

# run.config's record of the last stranding the run was told of, so that a wait is one
# event, not one a tick.
STRANDED_KEY = "stranded"


@dataclass
class PlacementChooser:
    """Placement's rule among the clusters failover admits; keeps the plan it chose, which
    the move stores as the run's layout where the hardware differs."""

    session: Session
    settings: Settings
    run: Run
    configs: dict[str, ClusterConfig]
    chosen: Resolved | None = field(default=None, init=False)

    def __call__(self, fitting: Sequence[OtherCluster]) -> OtherCluster | None:
        spec = RunSpec.model_validate(
            {**self.run.spec, "nodes": self.run.num_nodes, "min_nodes": None, "cluster": None}
        )
        shape = ModelShape.model_validate(self.run.config["model"])
        facts = read_facts(
            self.session, self.settings, spec, [self.configs[o.name] for o in fitting]
        )
        plans = [plan_on(f, spec, shape) for f in facts]
        choice = choose_cluster([p.option for p in plans])
        if choice is None:
            return None
        plan = next(p for p in plans if p.option is choice.chosen)
        self.chosen = plan.resolved
        return next(o for o in fitting if o.name == choice.chosen.name)


def fail_over_stranded_runs(settings: Settings) -> None:
    """Judge every run its cluster cannot run now; move the ones the rule says to move.
    A site of one cluster has nowhere to move a run: nothing to judge."""
    if len(registry.clusters(settings)) < 2:
        return
    with session_scope() as session:
        stranded = stranded_runs(session)
    for item in stranded:
        with session_scope() as session:
            judge(session, settings, item)


def judge(session: Session, settings: Settings, item: StrandedRun) -> FailoverDecision | None:
    """One stranded run: the rule's decision, acted on (None: nothing left to judge)."""
    run = repository.get_run(session, item.run_id, for_update=True)
    if run is None or run.cluster != item.cluster or run.state not in RUNS_THAT_NEED_A_CLUSTER:
        return None  # moved, ended or cancelled since the list was read
    configs = {c.name: c for c in registry.clusters(settings)}
    if run.cluster not in configs:
        return None  # a cluster the service no longer drives: nothing to weigh it against
    now = utcnow()
    reach, counts = reachability(session), placement_counts(session)
    checkpoint = repository.newest_committed_checkpoint(session, run.id)
    chooser = PlacementChooser(session, settings, run, configs)
    decision = decide(
        home_of(run, item, settings, now),
        [
            other_of(config, reach.get(name), counts.get(name, PlacementCounts()), checkpoint)
            for name, config in configs.items()
            if name != run.cluster
        ],
        need_nodes=run.num_nodes,
        hardware={c.hardware for c in configs.values()},
        limit_s=failover_limit_s(settings.failover_after_s, 0.0),  # no copy: mounted
        checkpoint_readable=False,  # copies are not made: only a cluster that mounts it
        choose=chooser,
    )
    stays = why_it_stays(run)
    if decision.action is FailoverAction.FAIL_OVER and not stays:
        assert decision.target is not None
        target = configs[decision.target]
        # Planned again there: a layout of its own where the GPUs differ (resharded).
        resharded = target.hardware != configs[run.cluster].hardware
        move(session, run, item, target, chooser.chosen if resharded else None, checkpoint, now)
    elif decision.action is not FailoverAction.STAY:
        say_stranded(session, run, item, decision, stays)
    return decision


def why_it_stays(run: Run) -> str:
    """Why a run the rule would move stays on its cluster ("": it moves): its spec pins the
    cluster (the user chose it), or it is a sweep's member (a sweep's runs are one job
    array on one cluster, reconcile/sweeps.py; the members wait for it together)."""
    if run.spec.get("cluster") is not None:
        return "pinned by its spec"
    if run.sweep_id is not None:
        return "a sweep's member: its array is on this cluster"
    return ""


def home_of(run: Run, item: StrandedRun, settings: Settings, now: datetime) -> RunCluster:
    """The run's cluster as the rule weighs it. Short of nodes since its last attempt ended
    (or it was submitted): until then it ran. Stepping while its ranks reported within the
    silence that marks a node's agent dead."""
    stepping = (
        run.last_progress_at is not None
        and (now - run.last_progress_at).total_seconds() < settings.heartbeat_dead_s
    )
    unreachable_for = (
        (now - item.unreachable_since).total_seconds() if item.unreachable_since else None
    )
    short = item.reason is FailoverReason.TOO_FEW_HEALTHY_NODES and run.state == RunState.PENDING
    return RunCluster(
        name=run.cluster,
        unreachable_for_s=unreachable_for,
        healthy_nodes=item.usable_nodes,
        spare_nodes=0,  # usable_nodes counts the spares already
        short_for_s=(now - waiting_since(run)).total_seconds() if short else 0.0,
        run_stepping=stepping,
    )


def waiting_since(run: Run) -> datetime:
    """Since when a run short of nodes has waited for them: its last attempt's end, or its
    submission (until then it ran, or had not asked)."""
    return max((a.ended_at for a in run.attempts if a.ended_at), default=run.created_at)


def other_of(
    config: ClusterConfig,
    reach: Reachability | None,
    counts: PlacementCounts,
    checkpoint: Checkpoint | None,
) -> OtherCluster:
    """A cluster the run might move to; one never read counts as silent (nothing is known
    of its nodes)."""
    return OtherCluster(
        name=config.name,
        hardware=config.hardware,
        reachable=reach is not None and reach.unreachable_since is None,
        free_nodes=counts.num_free,
        mounts_checkpoint=checkpoint is None or config.mounts_path(Path(checkpoint.path)),
    )


def say_stranded(
    session: Session, run: Run, item: StrandedRun, decision: FailoverDecision, stays: str
) -> None:
    """One event per stranding and reason: why the run waits for its cluster."""
    why = stays if decision.action is FailoverAction.FAIL_OVER else ""
    key = f"{item.reason.value}:{decision.reason.value}:{why}:{item.unreachable_since}"
    if run.config.get(STRANDED_KEY) == key:
        return
    run.config = {**run.config, STRANDED_KEY: key}
    waits = {
        FailoverReason.WITHIN_LIMIT: "waiting for it up to the site's failover limit",
        FailoverReason.NO_CLUSTER_FITS: "no other cluster can take it now; waiting",
        FailoverReason.STILL_STEPPING: "its ranks still train; staying",
    }
    then = f"staying: {why}" if why else waits.get(decision.reason, decision.reason.value)
    record_event(
        session,
        run,
        "run.stranded",
        f"cluster {run.cluster} cannot run it ({item.reason.value}); {then}",
        data={"cluster": run.cluster, "reason": item.reason.value, "decision": decision.reason},
    )


def move(
    session: Session,
    run: Run,
    item: StrandedRun,
    target: ClusterConfig,
    resharded_to: Resolved | None,
    checkpoint: Checkpoint | None,
    now: datetime,
) -> None:
    """The run continues on `target` from `checkpoint` (module docstring), in the layout
    `resharded_to` where the target's hardware differs (None: the run's own)."""
    home = run.cluster
    since = item.unreachable_since or waiting_since(run)
    resume = f"step {checkpoint.step}" if checkpoint else "scratch (no trusted checkpoint)"
    reason = f"cluster {home} cannot run it ({item.reason.value}); continues on {target.name}"
    incident = open_incident(
        session,
        kind="cluster",
        signal=f"cluster:{item.reason.value}",
        action=RecoveryAction.FAIL_OVER,
        message=f"run {run.id}: {reason} from {resume}",
        cluster=home,
        run_id=run.id,
        signal_at=since,
    )
    live = [a for a in run.attempts if a.state in repository.LIVE_ATTEMPT_STATES]
    for attempt in live[1:]:  # the other replica groups' jobs, ended beside the first
        set_stop_reason(attempt, StopReason.CLUSTER_FAILOVER)
        set_attempt_state(session, run, attempt, AttemptState.FAILED, reason)
    if live:
        end_attempt_and_restart(session, run, live[0], reason, cause=StopReason.CLUSTER_FAILOVER)
    run.cluster, run.nodes, run.reservation = target.name, [], None
    resharded = resharded_to is not None
    if resharded_to is not None:
        run.config = {
            **run.config,
            "layout": resharded_to.layout.model_dump(mode="json"),
            "plan": stored_plan(resharded_to),
        }
    run.config = {k: v for k, v in run.config.items() if k != STRANDED_KEY}
    run.state_reason = f"{reason}; waiting for nodes there"
    cost = move_cost(run, live, checkpoint, since, now)
    if incident is not None:
        incident.attempt_id = live[0].id if live else None
        incident.attempt_ended_at = now
        incident.resume_step = checkpoint.step if checkpoint else 0
        incident.details = {"from": home, "to": target.name, "resharded": resharded, **cost}
    record_event(
        session,
        run,
        "run.failed_over",
        f"{reason} from {resume}"
        + (f", resharded for {target.hardware}" if resharded else ", same layout"),
        data={
            "from": home,
            "to": target.name,
            "reason": item.reason.value,
            "resume_step": checkpoint.step if checkpoint else None,
            "checkpoint": checkpoint.path if checkpoint else None,
            "resharded": resharded,
            "layout": run.config["layout"],
            **cost,
        },
    )
    log.warning("run %s: %s from %s", run.id, reason, resume)


def move_cost(
    run: Run,
    ended: Sequence[Attempt],
    checkpoint: Checkpoint | None,
    since: datetime,
    now: datetime,
) -> dict[str, float | int | None]:
    """What the move costs that is known at the move: the wait (from the first silence to
    the move), and the steps trained since the checkpoint that will be trained again, with
    the time they took. The start on the other cluster is stamped on the incident as it
    happens (recovery/incident_timeline.py); no copy (the checkpoint is mounted)."""
    resume_step = checkpoint.step if checkpoint else 0
    last_step = max((a.last_step or 0 for a in ended), default=run.last_step or 0)
    last_report = max((a.last_progress_at for a in ended if a.last_progress_at), default=None)
    lost_work_s = (
        max(0.0, (last_report - checkpoint.committed_at).total_seconds())
        if checkpoint and checkpoint.committed_at and last_report
        else 0.0
    )
    return {
        "waited_s": round((now - since).total_seconds(), 3),
        "checkpoint_copy_s": 0.0,
        "steps_trained_again": max(0, last_step - resume_step),
        "lost_work_s": round(lost_work_s, 3),
    }
