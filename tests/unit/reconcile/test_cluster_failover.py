"""Failover between clusters, as the reconciler acts on it (service/reconcile/failover.py):
a run whose cluster is silent, ranks and controller both, past the site's limit continues
on the other cluster from its last trusted checkpoint; one whose ranks still report stays;
a pinned run stays; a cluster that does not mount the checkpoint is no target; the silent
cluster's return cancels the old job there and starts nothing. Two fake clusters of the
same shape (the `two` fixture); the run is put on the second by leaving the first no free
node at submission."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update

from contract import StopReason
from service.clusters import reachability, registry
from service.config_areas.clusters import ClusterConfig, ClusterReach
from service.db import session_scope
from service.models import (
    Attempt,
    AttemptState,
    Checkpoint,
    Incident,
    Node,
    NodeState,
    RecoveryAction,
    Run,
    RunEvent,
    RunState,
)
from service.models.base import utcnow
from service.reconcile.failover import why_it_stays
from service.reconcile.loop import Reconciler
from service.runs import repository
from service.runs.goodput import compute_goodput
from service.slurm.fake import DEFAULT_FAKE_CLUSTER, FakeSlurm
from tests.unit.reconcile.conftest import OTHER, Cluster

LIMIT_S = 60.0  # the site's failover_after_s in these tests
LONG_AGO = timedelta(seconds=10 * LIMIT_S)


@pytest.fixture
def limited(cluster: Cluster, two: FakeSlurm) -> FakeSlurm:
    """`two`, with a failover limit of LIMIT_S."""
    cluster.settings = cluster.settings.model_copy(update={"failover_after_s": LIMIT_S})
    cluster.reconciler = Reconciler(cluster.settings, cluster.slurm, two)
    cluster.tick()
    return two


def on_other(cluster: Cluster, two: FakeSlurm, **spec: object) -> int:
    """A run the placement rule puts on the second cluster (the first has no free node
    then), trained to step 40 (committed) and 50 (not), its ranks reporting."""
    with session_scope() as session:
        session.execute(
            update(Node).where(Node.cluster == DEFAULT_FAKE_CLUSTER).values(state=NodeState.DRAINED)
        )
    run_id = cluster.submit_run("mover", **spec)
    with session_scope() as session:
        session.execute(
            update(Node).where(Node.cluster == DEFAULT_FAKE_CLUSTER).values(state=NodeState.HEALTHY)
        )
    assert cluster.run(run_id).cluster == OTHER
    cluster.tick()
    two.schedule()
    cluster.tick()
    assert cluster.run(run_id).state == RunState.RUNNING
    cluster.train(run_id, 40)
    cluster.train(run_id, 50, committed=False)
    return run_id


def silence(two: FakeSlurm, run_id: int, ago: timedelta) -> None:
    """The second cluster's controller stops answering, and has been silent `ago`; the
    run's ranks last reported as long ago (its nodes went with it)."""
    two.break_call("show_nodes")
    since = utcnow() - ago
    with session_scope() as session:
        reachability.record_unreachable(session, OTHER, since, "slurmctld not responding")
        session.execute(update(Run).where(Run.id == run_id).values(last_progress_at=since))


def first_cluster_is(monkeypatch: pytest.MonkeyPatch, **fields: Any) -> None:
    """The two clusters configured again, the first (where a move goes) with `fields`."""
    configs = (
        ClusterConfig(
            name=DEFAULT_FAKE_CLUSTER, reach=ClusterReach.LOCAL, accelerator="cpu", **fields
        ),
        ClusterConfig(name=OTHER, accelerator="cpu"),
    )
    monkeypatch.setattr(registry, "clusters", lambda settings: configs)


def kinds(cluster: Cluster, run_id: int, kind: str) -> list[RunEvent]:
    with session_scope() as session:
        return list(
            session.scalars(
                select(RunEvent).where(RunEvent.run_id == run_id, RunEvent.kind == kind)
            )
        )


def test_a_silent_cluster_past_the_limit_moves_the_run_to_the_other_from_its_checkpoint(
    cluster: Cluster, limited: FakeSlurm
) -> None:
    run_id = on_other(cluster, limited)
    old_job = cluster.live_job(run_id)
    old_reservation = cluster.run(run_id).reservation
    silence(limited, run_id, LONG_AGO)
    cluster.tick()  # judged and moved, placed on the first cluster in the same tick
    run = cluster.run(run_id)
    assert run.cluster == DEFAULT_FAKE_CLUSTER and run.state == RunState.PENDING
    assert run.nodes and run.reservation in cluster.slurm.reservation_nodes
    old = cluster.attempts(run_id)[0]
    assert (old.state, old.stop_reason, old.cluster) == (
        AttemptState.FAILED,
        StopReason.CLUSTER_FAILOVER,
        OTHER,
    )
    assert run.num_restarts == run.num_hardware_restarts == 1  # none of max_restarts
    [moved] = kinds(cluster, run_id, "run.failed_over")
    assert moved.data["from"] == OTHER and moved.data["to"] == DEFAULT_FAKE_CLUSTER
    assert moved.data["resume_step"] == 40 and moved.data["steps_trained_again"] == 10
    assert moved.data["resharded"] is False  # the same hardware: the same layout
    assert moved.data["waited_s"] >= LONG_AGO.total_seconds()
    with session_scope() as session:
        [incident] = session.scalars(
            select(Incident).where(Incident.action == RecoveryAction.FAIL_OVER)
        ).all()
        assert (incident.run_id, incident.cluster, incident.resume_step) == (run_id, OTHER, 40)
        assert incident.signal == "cluster:controller_unreachable"
        assert incident.details["checkpoint_copy_s"] == 0.0 and incident.attempt_ended_at

    cluster.slurm.schedule()
    cluster.tick()
    new = cluster.attempts(run_id)[-1]
    assert (new.cluster, new.state, new.resume_step) == (
        DEFAULT_FAKE_CLUSTER,
        AttemptState.RUNNING,
        40,
    )
    # Job ids are per cluster (both fakes count from 1000): the job is told by its name.
    assert cluster.slurm.jobs[new.slurm_job_id or ""].name == new.job_name
    assert new.job_name not in {j.name for j in limited.jobs.values()}
    cluster.train(run_id, 60)  # its first step: the incident is resolved with its timeline
    with session_scope() as session:
        incident = session.scalars(
            select(Incident).where(Incident.action == RecoveryAction.FAIL_OVER)
        ).one()
        assert incident.first_step_at is not None and incident.submitted_at is not None

    # The silent cluster answers again, hours later: its old job is cancelled there, its
    # reservation swept, and nothing is started on it.
    with session_scope() as session:
        session.execute(
            update(Attempt)
            .where(Attempt.id == old.id)
            .values(ended_at=utcnow() - timedelta(hours=3))
        )
    assert limited.jobs[old_job].state == "RUNNING"
    limited.heal_call("show_nodes")
    cluster.tick()
    assert limited.jobs[old_job].state == "CANCELLED"
    assert old_reservation not in limited.reservation_nodes
    limited.schedule()
    cluster.tick()
    assert [j for j in limited.jobs if limited.jobs[j].state in ("PENDING", "RUNNING")] == []
    assert cluster.run(run_id).cluster == DEFAULT_FAKE_CLUSTER
    assert len(cluster.attempts(run_id)) == 2


def test_its_goodput_says_what_the_move_cost(cluster: Cluster, limited: FakeSlurm) -> None:
    run_id = on_other(cluster, limited)
    silence(limited, run_id, LONG_AGO)
    cluster.tick()
    cluster.slurm.schedule()
    cluster.tick()
    cluster.train(run_id, 60)
    with session_scope() as session:
        run = repository.get_run(session, run_id)
        assert run is not None
        checkpoints = list(session.scalars(select(Checkpoint).where(Checkpoint.run_id == run_id)))
        attempts = sorted(run.attempts, key=lambda a: a.number)
        goodput = compute_goodput(run, attempts, checkpoints)
    assert goodput.lost.cluster_failover_s > 0
    assert goodput.lost.drain_and_resubmit_s == 0  # the move is its own cause


def test_a_run_whose_ranks_still_report_stays_on_its_silent_cluster(
    cluster: Cluster, limited: FakeSlurm
) -> None:
    run_id = on_other(cluster, limited)
    silence(limited, run_id, LONG_AGO)
    cluster.train(run_id, 55, committed=False)  # Slurm's jobs outlive their slurmctld
    cluster.tick(2)
    assert cluster.run(run_id).cluster == OTHER
    assert cluster.run(run_id).state == RunState.RUNNING
    assert not kinds(cluster, run_id, "run.failed_over")


def test_within_the_limit_the_run_waits_and_says_so_once(
    cluster: Cluster, limited: FakeSlurm
) -> None:
    run_id = on_other(cluster, limited)
    silence(limited, run_id, timedelta(seconds=LIMIT_S / 2))
    cluster.tick(3)
    assert cluster.run(run_id).cluster == OTHER
    [waiting] = kinds(cluster, run_id, "run.stranded")
    assert "up to the site's failover limit" in waiting.message


def test_a_pinned_run_stays_on_its_cluster(cluster: Cluster, limited: FakeSlurm) -> None:
    run_id = cluster.submit_run("pinned", cluster=OTHER)
    cluster.tick()
    limited.schedule()
    cluster.tick()
    cluster.train(run_id, 40)
    silence(limited, run_id, LONG_AGO)
    cluster.tick(2)
    assert cluster.run(run_id).cluster == OTHER
    [waiting] = kinds(cluster, run_id, "run.stranded")
    assert "pinned by its spec" in waiting.message


def test_a_cluster_that_does_not_mount_the_checkpoint_is_no_target(
    cluster: Cluster, limited: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    first_cluster_is(monkeypatch, mounts=(Path("/elsewhere"),))
    run_id = on_other(cluster, limited)
    silence(limited, run_id, LONG_AGO)
    cluster.tick(2)
    assert cluster.run(run_id).cluster == OTHER
    [waiting] = kinds(cluster, run_id, "run.stranded")
    assert "no other cluster can take it" in waiting.message


def test_a_cluster_of_other_gpus_gets_a_layout_planned_for_them(
    cluster: Cluster, limited: FakeSlurm, monkeypatch: pytest.MonkeyPatch
) -> None:
    first_cluster_is(monkeypatch, hardware="a100-80gb")
    run_id = on_other(cluster, limited)
    assert cluster.run(run_id).config["plan"]["hardware"] != "a100-80gb"
    silence(limited, run_id, LONG_AGO)
    cluster.tick()
    run = cluster.run(run_id)
    assert run.cluster == DEFAULT_FAKE_CLUSTER
    [moved] = kinds(cluster, run_id, "run.failed_over")
    assert moved.data["resharded"] is True
    assert run.config["plan"]["hardware"] == "a100-80gb"


def test_a_site_of_one_cluster_judges_nothing(cluster: Cluster) -> None:
    run_id = cluster.submit_run("alone", nodes=6, global_batch=6)
    with session_scope() as session:
        session.execute(update(Node).values(state=NodeState.DRAINED))
    cluster.tick(2)
    assert not kinds(cluster, run_id, "run.stranded")


def test_a_pinned_run_and_a_sweeps_member_stay_others_move() -> None:
    assert why_it_stays(Run(spec={"cluster": OTHER}, sweep_id=None)) == "pinned by its spec"
    assert "sweep's member" in why_it_stays(Run(spec={"cluster": None}, sweep_id=3))
    assert why_it_stays(Run(spec={}, sweep_id=None)) == ""
