"""A worker's report that names a node is a claim, not a verdict.

The ranks of a run are the run's owner's code: a script can post `worker:sdc` naming any of
its nodes, or skew its own update timings until a node looks slow. Believed as they come,
such reports walk a run across the cluster and leave every node it touched drained for an
admin. So a drain that only a report asks for is:
- confined to the reporting attempt's own nodes (workers/service.py refuses other names);
- confirmed as far as the service can: an SDC report ends the attempt (its ranks stop:
  worker/sdc.py), and a slow node is flagged only after `slow_node_reports` consecutive
  reports beyond the margin (nodes/stragglers.py), then moved only at a checkpoint;
- capped: at most `report_drains_per_run` per run within `report_drain_window_s`. Past the
  cap the service drains nothing and opens an incident for the on-call instead;
- paid for: each counts against the run's `max_restarts` (service/recovery/restart.py).
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.config import Settings
from service.models import Incident, IncidentState, RecoveryAction, Run
from service.models.base import utcnow
from service.recovery.signals import open_incident

SDC_SIGNAL = "sdc:mismatch"  # a replica's parameters differed (recovery/sdc.py)
SLOW_SIGNAL = "node:slow"  # a node persistently slower than its peers (recovery/slow_nodes.py)
CAPPED_SIGNAL = "report:drain_cap"  # a claimed drain past the cap: for the on-call
REPORT_SIGNALS = (SDC_SIGNAL, SLOW_SIGNAL)


def drains_left(session: Session, run: Run, settings: Settings) -> int:
    """How many more report-caused drains `run` may cause in the current window."""
    since = utcnow() - timedelta(seconds=settings.report_drain_window_s)
    used = session.scalar(
        select(func.count())
        .select_from(Incident)
        .where(
            Incident.run_id == run.id,
            Incident.signal.in_(REPORT_SIGNALS),
            Incident.action == RecoveryAction.DRAIN_AND_MOVE,
            Incident.detected_at >= since,
        )
    )
    return max(0, settings.report_drains_per_run - int(used or 0))


def drain_claimed(
    session: Session,
    run: Run,
    settings: Settings,
    *,
    kind: str,
    signal: str,
    node: str,
    attempt_id: int | None,
    message: str,
) -> bool:
    """Open the drain-and-move incident a report asks for, if the run's cap allows; else an
    incident for the on-call that drains nothing. True if the drain was opened."""
    if drains_left(session, run, settings) > 0:
        opened = open_incident(
            session,
            kind=kind,
            signal=signal,
            action=RecoveryAction.DRAIN_AND_MOVE,
            cluster=run.cluster,
            node=node,
            run_id=run.id,
            attempt_id=attempt_id,
            message=message,
        )
        return opened is not None
    window_h = settings.report_drain_window_s / 3600
    capped = open_incident(
        session,
        kind="report_cap",
        signal=CAPPED_SIGNAL,
        action=RecoveryAction.OBSERVE,
        cluster=run.cluster,
        node=node,
        attempt_id=attempt_id,
        message=f"{node}: not drained: run {run.id} already caused "
        f"{settings.report_drains_per_run} drains by its own reports within {window_h:g} h "
        f"(RUNYARD_REPORT_DRAINS_PER_RUN); on-call: check the node and the run. "
        f"The claim: {message}"[:2000],
    )
    if capped is not None:
        # A record for the on-call (incident list, the incidents-opened counter's alert),
        # not a recovery: nothing for the reconciler to carry out, no run's timeline to
        # join (it names the run in its message, not as the run's incident), and the node
        # stays in service.
        capped.state, capped.attempt_ended_at = IncidentState.RESOLVED, utcnow()
        capped.resolved_at = capped.attempt_ended_at
    return False
