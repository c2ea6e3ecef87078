"""A hung run (its step counter stopped) restarts where it was: the ranks' stacks are
collected through the job first, then the job is cancelled; it counts against max_restarts."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
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
    cluster.reconciler.watching_since = an_hour_ago
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


def test_a_node_signal_delivered_after_the_run_moved_on_restarts_nothing(
    cluster: Cluster,
) -> None:
    """An Xid 94 (restart the application) observed during attempt 1 reaches the service
    only after attempt 2 was submitted (the agent's outbox, after an outage): attempt 2 is
    healthy and keeps running, with no restart charged."""
    from service.recovery.classification import Classifier
    from service.recovery.signals import SignalIn, ingest_node_events

    run_id = cluster.submit_run("late-signal")
    cluster.cycle()
    seen_at = utcnow()
    cluster.slurm.finish(cluster.live_job(run_id), exit_code=1)  # attempt 1 fails
    cluster.tick(2)
    cluster.slurm.schedule()
    cluster.tick()
    _, second = cluster.attempts(run_id)
    assert second.state == AttemptState.RUNNING and cluster.run(run_id).num_restarts == 1
    node = cluster.run(run_id).nodes[0]
    late = SignalIn(f"{node}-xid-94-late", "xid", 94, "Xid 94: contained ECC", seen_at, {})
    with session_scope() as session:
        ingest_node_events(session, "default", node, [late], cluster.settings, Classifier())
    cluster.tick()
    assert cluster.attempts(run_id)[-1].id == second.id
    assert cluster.attempts(run_id)[-1].state == AttemptState.RUNNING
    assert cluster.run(run_id).num_restarts == 1
    with session_scope() as session:
        (incident,) = session.scalars(select(Incident).where(Incident.node_name == node))
        assert incident.state == IncidentState.RESOLVED


def test_an_xid_94_restarts_the_run_on_its_own_nodes(cluster: Cluster) -> None:
    """A node's restart-the-application signal (no run named: found by its node) ends the
    live attempt and restarts the run where it was, without draining the node. This path
    used to fail every tick (the run's attempts were not loaded) and hold up every later
    incident."""
    from service.recovery.classification import Classifier
    from service.recovery.signals import SignalIn, ingest_node_events

    run_id = cluster.submit_run("xid-94")
    cluster.cycle()
    job, nodes = cluster.live_job(run_id), cluster.run(run_id).nodes
    event = SignalIn(f"{nodes[0]}-xid-94", "xid", 94, "Xid 94: contained ECC", utcnow(), {})
    with session_scope() as session:
        ingest_node_events(session, "default", nodes[0], [event], cluster.settings, Classifier())
    cluster.tick()
    restarted, retry = cluster.attempts(run_id)
    assert restarted.stop_reason == StopReason.RECOVERY_RESTART
    assert cluster.slurm.jobs[job].state == "CANCELLED"
    assert cluster.run(run_id).nodes == nodes and not cluster.slurm.nodes[nodes[0]].drained
    assert retry.state in (AttemptState.SUBMITTING, AttemptState.PENDING)


def test_an_incident_that_cannot_be_carried_out_does_not_hold_up_the_next(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Incidents are carried out in id order every tick: one that fails with an error that
    is not Slurm's must not stop the drain of another node behind it."""
    from service.recovery import incidents

    cluster.set_spares(1)
    first = cluster.submit_run("first", nodes=1)
    second = cluster.submit_run("second", nodes=1)
    cluster.cycle()
    cluster.train(first, 20)
    broken_node = cluster.run(first).nodes[0]
    failed_node = cluster.run(second).nodes[0]
    real = incidents.restart_in_place

    def broken(item: Any, slurm: Any) -> None:
        raise RuntimeError("a bug in one incident's path")

    monkeypatch.setattr(incidents, "restart_in_place", broken)
    with session_scope() as session:
        run = session.get(Run, first)
        assert run is not None
        run.last_progress_at = utcnow() - timedelta(hours=1)
    cluster.reconciler.watching_since = utcnow() - timedelta(hours=1)
    cluster.tick()  # the hang check opens the first run's incident
    with session_scope() as session:
        (hang,) = session.scalars(select(Incident).where(Incident.run_id == first))
        assert hang.signal == "hang:no_progress"
    cluster.xid(failed_node)  # then the second run's node fails: a later incident
    cluster.tick()
    assert cluster.slurm.nodes[failed_node].drained, "the later incident was carried out"
    assert not cluster.slurm.nodes[broken_node].drained
    monkeypatch.setattr(incidents, "restart_in_place", real)
