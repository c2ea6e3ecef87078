"""Preemption: a waiting prod run asks a lower-priority run to checkpoint and yield, takes its
nodes once it left, and a rank that ignores the request is cancelled after the grace."""

from __future__ import annotations

from datetime import timedelta

from contract import StopReason
from service.models import AttemptState, RunState
from service.models.base import utcnow
from tests.unit.reconcile.conftest import Cluster


def fill_with_scavengers(cluster: Cluster) -> list[int]:
    ids = [
        cluster.submit_run(f"scavenger-{i}", nodes=3, global_batch=12, priority="scavenger")
        for i in range(2)
    ]
    cluster.cycle()
    assert all(cluster.run(r).state == RunState.RUNNING for r in ids)
    return ids


def test_a_prod_run_makes_a_scavenger_yield_and_takes_its_nodes(cluster: Cluster) -> None:
    older, newer = fill_with_scavengers(cluster)
    prod = cluster.submit_run("prod", nodes=2, priority="prod")
    cluster.tick()
    # The newest of the lowest class yields; one run of 3 nodes covers the 2 needed.
    asked = cluster.attempts(newer)[0]
    assert asked.stop_reason == StopReason.PREEMPTED and asked.stopped_for_run_id == prod
    assert cluster.attempts(older)[0].stop_requested_at is None
    assert cluster.slurm.jobs[asked.slurm_job_id].state == "RUNNING"  # asked, not killed
    cluster.tick()
    assert cluster.events(prod).count("run.preempting") == 1  # not asked again meanwhile

    cluster.train(newer, 40)  # the ranks checkpoint and exit 0
    cluster.slurm.finish(asked.slurm_job_id, exit_code=0)
    for _ in range(3):
        cluster.tick()
        if cluster.run(prod).nodes:
            break
    stopped = cluster.attempts(newer)[0]
    assert stopped.state == AttemptState.STOPPED
    yielded = cluster.run(newer)
    assert yielded.state == RunState.PENDING and yielded.nodes == []
    assert yielded.num_restarts == 0  # a yield is not a failure
    assert set(cluster.run(prod).nodes) <= set(cluster.slurm.jobs[asked.slurm_job_id].nodes)
    cluster.slurm.schedule()
    cluster.tick()
    assert cluster.run(prod).state == RunState.RUNNING


def test_ranks_that_ignore_a_stop_request_are_cancelled_after_the_grace(
    cluster: Cluster,
) -> None:
    _, newer = fill_with_scavengers(cluster)
    cluster.submit_run("prod", nodes=2, priority="prod")
    cluster.tick()
    job = cluster.live_job(newer)
    cluster.tick()
    assert cluster.slurm.jobs[job].state == "RUNNING"  # still within the grace
    grace = timedelta(seconds=cluster.settings.stop_grace_s + 1)
    cluster.age_attempt(newer, stop_requested_at=utcnow() - grace)
    cluster.tick()
    assert cluster.slurm.jobs[job].state == "CANCELLED"


def test_equal_priorities_never_preempt(cluster: Cluster) -> None:
    fill_with_scavengers(cluster)
    waiting = cluster.submit_run("another-scavenger", priority="scavenger")
    cluster.tick(2)
    assert "run.preempting" not in cluster.events(waiting)
    assert cluster.slurm.calls["cancel"] == 0


def test_a_segment_at_its_time_limit_yields_and_resumes_on_the_same_nodes(
    cluster: Cluster,
) -> None:
    run_id = cluster.submit_run("segments", time_limit_min=30)
    cluster.cycle()
    nodes = cluster.run(run_id).nodes
    cluster.age_attempt(run_id, started_at=utcnow() - timedelta(minutes=28))  # margin 180 s
    cluster.tick()
    (attempt,) = cluster.attempts(run_id)
    assert attempt.stop_reason == StopReason.TIME_LIMIT
    cluster.train(run_id, 60)
    cluster.slurm.finish(attempt.slurm_job_id, exit_code=0)
    cluster.tick(2)
    stopped, segment = cluster.attempts(run_id)
    assert stopped.state == AttemptState.STOPPED and segment.resume_step == 60
    assert cluster.run(run_id).nodes == nodes and cluster.run(run_id).num_restarts == 0
    assert cluster.slurm.jobs[segment.slurm_job_id].nodelist == tuple(nodes)
