"""A hung run (its step counter stopped) restarts where it was: the ranks' stacks are
collected through the job first, then the job is cancelled; it counts against max_restarts."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from contract import StopReason
from service.db import session_scope
from service.models import AttemptState, Incident, IncidentState, Run, RunState
from service.models.base import utcnow
from tests.unit.reconcile.conftest import Cluster


def test_a_hung_run_gets_its_stacks_read_then_restarts_on_the_same_nodes(
    cluster: Cluster,
) -> None:
    run_id = cluster.submit_run("hangs")
    cluster.cycle()
    cluster.train(run_id, 20)
    job, nodes = cluster.live_job(run_id), cluster.run(run_id).nodes
    cluster.slurm.stacks[job] = "== unit001 pid 7\nThread 7: allreduce (torch/distributed)"
    an_hour_ago = utcnow() - timedelta(hours=1)
    with session_scope() as session:  # nothing reported for an hour
        run = session.get(Run, run_id)
        assert run is not None
        run.last_progress_at = an_hour_ago
    cluster.reconciler.started_at = an_hour_ago
    cluster.tick(2)  # the hang check opens the incident; the next tick carries it out

    assert cluster.slurm.calls["run_in_job"] == 1 and cluster.slurm.jobs[job].state == "CANCELLED"
    hung, retry = cluster.attempts(run_id)
    assert hung.state == AttemptState.FAILED and hung.stop_reason == StopReason.RECOVERY_RESTART
    run = cluster.run(run_id)
    assert run.state == RunState.PENDING and run.num_restarts == 1
    assert run.num_hardware_restarts == 0 and run.nodes == nodes
    assert cluster.slurm.jobs[retry.slurm_job_id].nodelist == tuple(nodes)
    with session_scope() as session:
        (incident,) = session.scalars(select(Incident).where(Incident.run_id == run_id))
        assert incident.signal == "hang:no_progress" and incident.state == IncidentState.OPEN
        assert "allreduce" in incident.details["stacks"]
