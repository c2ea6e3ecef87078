"""The runs whose cluster cannot run them now: where failover between clusters starts.

Two conditions, the failover rule's own (service/clusters/failover.py): the cluster's
controller has not answered the reconciler (service/clusters/reachability.py), or it has
fewer usable nodes (healthy or spare, the run's own included) than the run needs, so that no
recovery inside the cluster can restore it. Each comes with since when, as far as the
database knows, which the rule measures against the site's limit. This module only lists
them; deciding to wait or move, and moving, is the reconciler's next stage (issue 41).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.clusters.failover import FailoverReason, why_it_cannot_run
from service.clusters.reachability import reachability
from service.models import Node, NodeState, Run, RunState

# Runs that train or wait to: an ended or cancelling run needs no cluster.
RUNS_THAT_NEED_A_CLUSTER = (RunState.PENDING, RunState.RUNNING)
USABLE_NODE_STATES = (NodeState.HEALTHY, NodeState.SPARE)


@dataclass(frozen=True)
class StrandedRun:
    """A run its cluster cannot run now, and why."""

    run_id: int
    cluster: str
    reason: FailoverReason  # CONTROLLER_UNREACHABLE or TOO_FEW_HEALTHY_NODES
    need_nodes: int
    usable_nodes: int  # healthy and spare nodes on its cluster (when reachable)
    unreachable_since: datetime | None = None  # since when its controller is silent


def stranded_runs(session: Session) -> list[StrandedRun]:
    """Every PENDING or RUNNING run its cluster cannot run now, by run id. A cluster whose
    nodes were never synced has no usable nodes counted, but is listed only when silent:
    nothing is known against it."""
    reach = reachability(session)
    usable = dict(
        session.execute(
            select(Node.cluster, func.count())
            .where(Node.state.in_(USABLE_NODE_STATES))
            .group_by(Node.cluster)
        ).all()
    )
    known = set(session.scalars(select(Node.cluster).distinct()))
    runs = session.execute(
        select(Run.id, Run.cluster, Run.num_nodes)
        .where(Run.state.in_(RUNS_THAT_NEED_A_CLUSTER))
        .order_by(Run.id)
    ).all()
    stranded = []
    for run_id, cluster, need in runs:
        since = reach[cluster].unreachable_since if cluster in reach else None
        have = int(usable.get(cluster, 0))
        reason = why_it_cannot_run(
            unreachable=since is not None,
            usable_nodes=have if cluster in known else need,  # never synced: not judged
            need_nodes=need,
        )
        if reason is not None:
            stranded.append(StrandedRun(run_id, cluster, reason, need, have, since))
    return stranded
