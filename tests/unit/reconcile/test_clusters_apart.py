"""Node names repeat across clusters (each slurmctld names its own nodes): the reconciler
of one cluster reads, drains, spares and recovers its own nodes only, however another
cluster's nodes of the same names fare. Two fake clusters, both with unit001..unit006."""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select, update

from service.db import session_scope
from service.models import Incident, Node, NodeState
from service.models.base import utcnow
from service.nodes import service as nodes
from service.slurm.fake import FakeSlurm
from service.slurm.snapshot import take_snapshot
from tests.unit.reconcile.conftest import Cluster

OTHER = "runyard-dev-b"


def other_cluster(cluster: Cluster) -> FakeSlurm:
    """A second cluster of the same shape and node names, its nodes in the database as its
    own reconciler would have synced them."""
    other = FakeSlurm.cluster(
        num_switches=2, nodes_per_switch=3, num_gpus=1, prefix="unit", cluster_name=OTHER
    )
    snapshot = take_snapshot(other)
    with session_scope() as session:
        nodes.sync_from_slurm(session, OTHER, list(snapshot.nodes.values()), {})
    return other


def states(cluster_name: str) -> dict[str, NodeState]:
    with session_scope() as session:
        rows = session.execute(
            select(Node.name, Node.state).where(Node.cluster == cluster_name)
        ).all()
    return {name: state for name, state in rows}


def test_the_same_names_on_two_clusters_are_two_nodes(cluster: Cluster) -> None:
    cluster.tick()
    other_cluster(cluster)
    assert set(states("default")) == set(states(OTHER)) == {f"unit00{i}" for i in range(1, 7)}


def test_a_silent_node_on_another_cluster_is_not_this_reconcilers(cluster: Cluster) -> None:
    cluster.tick()
    other_cluster(cluster)
    long_ago = utcnow() - timedelta(hours=1)
    with session_scope() as session:
        session.execute(
            update(Node).where(Node.cluster == OTHER).values(last_heartbeat_at=long_ago)
        )
    cluster.tick(3)
    assert set(states(OTHER).values()) == {NodeState.HEALTHY}  # left to its own reconciler
    with session_scope() as session:
        assert not session.scalars(select(Incident).where(Incident.cluster == OTHER)).all()


def test_an_xid_drains_the_node_of_its_own_cluster_and_takes_a_spare_there(
    cluster: Cluster,
) -> None:
    cluster.set_spares(1)
    other = other_cluster(cluster)
    run_id = cluster.submit_run("apart", nodes=2, global_batch=8)
    cluster.cycle()
    bad = cluster.run(run_id).nodes[0]
    cluster.xid(bad)
    cluster.tick()
    assert states("default")[bad] == NodeState.DRAINED
    assert states(OTHER)[bad] == NodeState.HEALTHY
    assert "DRAIN" in cluster.slurm.nodes[bad].state and "DRAIN" not in other.nodes[bad].state
    run = cluster.run(run_id)
    assert bad not in run.nodes and run.cluster == "default"
    assert {a.cluster for a in run.attempts} == {"default"}
