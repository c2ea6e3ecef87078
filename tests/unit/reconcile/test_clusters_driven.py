"""One reconciler drives every configured cluster: each tick reads each cluster through its
own client, places and submits each run on its own cluster, and a cluster that does not
answer sits the tick out, recorded unreachable since its first failure, while the others
tick on. Two fake clusters with the same node names (unit001..unit006)."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import select

from service.clusters import reachability
from service.clusters.failover import FailoverReason
from service.clusters.stranded import StrandedRun, stranded_runs
from service.db import session_scope
from service.models import Node, NodeState, RunState
from service.models.base import utcnow
from service.reconcile.loop import NoClusterAnswered, Reconciler
from service.slurm.cli import CliSlurmClient
from service.slurm.fake import DEFAULT_FAKE_CLUSTER, FakeSlurm
from tests.unit.reconcile.conftest import OTHER, Cluster


def reach_of(name: str) -> reachability.Reachability | None:
    with session_scope() as session:
        return reachability.reachability(session).get(name)


def test_a_run_pinned_to_the_second_cluster_is_placed_and_submitted_there(
    cluster: Cluster, two: FakeSlurm
) -> None:
    run_id = cluster.submit_run("there", cluster=OTHER)
    cluster.tick()
    two.schedule()
    cluster.tick()
    run = cluster.run(run_id)
    assert (run.cluster, run.state) == (OTHER, RunState.RUNNING)
    assert {a.cluster for a in run.attempts} == {OTHER}
    assert len(two.jobs) == 1 and not cluster.slurm.jobs  # the job went to its cluster only
    assert set(two.reservation_nodes[run.reservation or ""]) == set(run.nodes)
    assert run.reservation not in cluster.slurm.reservation_nodes


def test_a_silent_cluster_sits_the_tick_out_while_the_other_ticks_on(
    cluster: Cluster, two: FakeSlurm
) -> None:
    there = cluster.submit_run("there", cluster=OTHER)
    two.break_call("show_nodes")
    here = cluster.submit_run("here", cluster=DEFAULT_FAKE_CLUSTER)
    cluster.cycle()
    assert cluster.run(here).state == RunState.RUNNING
    assert cluster.run(there).state == RunState.PENDING and not two.jobs
    first = reach_of(OTHER)
    assert first is not None and first.unreachable_since is not None
    assert "not responding" in first.detail
    cluster.tick()  # still silent: the silence is measured from its first failure
    assert reach_of(OTHER) == first
    stranded = {s.run_id: s for s in _stranded()}
    assert stranded[there].reason is FailoverReason.CONTROLLER_UNREACHABLE
    assert stranded[there].unreachable_since == first.unreachable_since
    assert here not in stranded

    two.heal_call("show_nodes")
    cluster.tick()
    back = reach_of(OTHER)
    assert back is not None and back.unreachable_since is None
    two.schedule()
    cluster.tick()
    assert cluster.run(there).state == RunState.RUNNING


def test_a_new_leader_keeps_the_silence_another_leader_saw_begin(
    cluster: Cluster, two: FakeSlurm
) -> None:
    long_ago = utcnow() - timedelta(minutes=10)
    with session_scope() as session:
        reachability.record_unreachable(session, OTHER, long_ago, "slurmctld not responding")
    two.break_call("show_nodes")
    Reconciler(cluster.settings, cluster.slurm, two).tick()
    seen = reach_of(OTHER)
    assert seen is not None and seen.unreachable_since == long_ago


def test_no_cluster_answering_fails_the_tick(cluster: Cluster, two: FakeSlurm) -> None:
    cluster.slurm.break_call("show_nodes")
    two.break_call("show_nodes")
    with pytest.raises(NoClusterAnswered):
        cluster.tick()


def test_a_cluster_with_too_few_usable_nodes_strands_its_runs(
    cluster: Cluster, two: FakeSlurm
) -> None:
    run_id = cluster.submit_run("big", cluster=OTHER, nodes=4, global_batch=8)
    with session_scope() as session:
        for node in session.scalars(select(Node).where(Node.cluster == OTHER)).all()[:3]:
            node.state = NodeState.DRAINED
    stranded = {s.run_id: s for s in _stranded()}
    assert stranded[run_id].reason is FailoverReason.TOO_FEW_HEALTHY_NODES
    assert (stranded[run_id].need_nodes, stranded[run_id].usable_nodes) == (4, 3)


def _stranded() -> list[StrandedRun]:
    with session_scope() as session:
        return stranded_runs(session)


def test_the_service_drives_each_configured_cluster_through_its_own_target(
    cluster: Cluster, two: FakeSlurm
) -> None:
    drivers = Reconciler(cluster.settings).drivers  # the real clients, one per cluster
    assert [d.name for d in drivers] == [DEFAULT_FAKE_CLUSTER, OTHER]
    local, remote = (d.slurm for d in drivers)
    assert isinstance(local, CliSlurmClient) and isinstance(remote, CliSlurmClient)
    assert local.target.argv(["squeue"]) == ["squeue"]
    assert remote.target.argv(["squeue", "-h"]) == ["squeue", "-M", OTHER, "-h"]
