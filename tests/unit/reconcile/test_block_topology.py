"""topology/block decisions (Slurm 24.05+): a run's model replicas are placed inside blocks
and asked for with --segment, and after a failure a replica moves whole to a block with room
unless a spare waits in its own block. Against the real database and a fake Slurm whose
switches are blocks of two single-GPU nodes."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db import session_scope
from service.models import NodeState, RunState
from service.reconcile import submission
from service.runs import repository
from service.slurm.fake import FakeSlurm
from tests.unit.reconcile.conftest import Cluster

PIPELINE_OF_TWO = {"parallelism": {"pp": 2, "tp": 1, "cp": 1}}  # a replica spans 2 nodes


def block_cluster(settings: Settings, num_blocks: int, block_size: int) -> Cluster:
    """Blocks of `block_size` single-GPU nodes: unit001... in block1, then block2, ..."""
    slurm = FakeSlurm.cluster(
        num_switches=num_blocks, nodes_per_switch=block_size, num_gpus=1, prefix="unit"
    )
    for node in slurm.nodes.values():
        node.switch = (node.switch or "").replace("leaf", "block")
    slurm.block_size = block_size
    cluster = Cluster(settings, slurm)
    cluster.set_spares(0)
    return cluster


@pytest.fixture
def blocks(db: sessionmaker[Session], settings: Settings) -> Cluster:
    """Four blocks of two nodes: unit001-002 block1, ... unit007-008 block4."""
    return block_cluster(settings, num_blocks=4, block_size=2)


def block_of(cluster: Cluster, node: str) -> str | None:
    return cluster.slurm.nodes[node].switch


def test_a_run_of_two_blocks_lands_on_whole_blocks_and_asks_for_segments(
    blocks: Cluster,
) -> None:
    blocks.set_spares(1)  # unit001: block1 keeps one free node
    run_id = blocks.submit_run("two-blocks", nodes=4, global_batch=8, **PIPELINE_OF_TWO)
    blocks.cycle()
    run = blocks.run(run_id)
    assert run.state == RunState.RUNNING
    assert run.nodes == ["unit003", "unit004", "unit005", "unit006"]  # blocks 2 and 3, whole
    placed = run.config["placement"]
    assert placed["topology"] == "block" and placed["segment"] == 2
    assert placed["groups"] == {"block2": "unit[003-004]", "block3": "unit[005-006]"}
    with session_scope() as session:
        live = repository.get_run(session, run_id)
        assert live is not None
        attempt = repository.live_attempt(live)
        assert attempt is not None
        assert submission.attempt_request(live, attempt, blocks.settings).segment == 2


def test_after_an_xid_the_replica_moves_whole_to_a_block_with_room(blocks: Cluster) -> None:
    blocks.set_spares(1)
    run_id = blocks.submit_run("moves", nodes=4, global_batch=8, **PIPELINE_OF_TWO)
    blocks.cycle()
    blocks.train(run_id, 20)

    blocks.xid("unit004")  # block2: no spare there (the spare is unit001, block1)
    blocks.tick()
    assert "recovery.replica_moves" in blocks.events(run_id)
    blocks.cycle()

    run = blocks.run(run_id)
    assert run.state == RunState.RUNNING
    # unit003 (healthy, but its replica's block lost a node) is let go with unit004; the
    # replica lands whole in block4, the block with room for two.
    assert run.nodes == ["unit005", "unit006", "unit007", "unit008"]
    replicas = [run.nodes[i : i + 2] for i in (0, 2)]
    assert all(block_of(blocks, a) == block_of(blocks, b) for a, b in replicas), replicas
    assert blocks.node("unit004").state == NodeState.DRAINED
    assert blocks.node("unit003").state == NodeState.HEALTHY
    retry = blocks.attempts(run_id)[-1]
    assert blocks.slurm.jobs[retry.slurm_job_id].nodelist == tuple(run.nodes)


def test_a_spare_in_the_failed_nodes_block_takes_its_place(
    db: sessionmaker[Session], settings: Settings
) -> None:
    cluster = block_cluster(settings, num_blocks=2, block_size=4)
    cluster.set_spares(1)  # unit001, block1
    run_id = cluster.submit_run("swaps", nodes=2, global_batch=8, **PIPELINE_OF_TWO)
    cluster.cycle()
    # Best fit: block1's three free nodes hold one whole replica, block2's four two.
    assert cluster.run(run_id).nodes == ["unit002", "unit003"]
    cluster.train(run_id, 20)

    cluster.xid("unit003")
    cluster.tick()

    run = cluster.run(run_id)
    assert run.nodes == ["unit002", "unit001"]  # the block's spare, nothing else moved
    assert "recovery.spare_assigned" in cluster.events(run_id)
    assert "recovery.replica_moves" not in cluster.events(run_id)


def test_no_replica_straddles_two_blocks_when_the_free_nodes_are_uneven(
    db: sessionmaker[Session], settings: Settings
) -> None:
    cluster = block_cluster(settings, num_blocks=3, block_size=4)
    cluster.set_spares(2)  # unit001 (block1), unit005 (block2): 3, 3 and 4 nodes free
    run_id = cluster.submit_run("uneven", nodes=8, global_batch=8, **PIPELINE_OF_TWO)
    cluster.cycle()
    run = cluster.run(run_id)
    assert run.state == RunState.RUNNING
    # Packing node by node would take 4 + 3 + 1 and split a replica between block1 and
    # block2; in whole replicas it is 4 + 2 + 2.
    replicas = [run.nodes[i : i + 2] for i in range(0, 8, 2)]
    assert all(block_of(cluster, a) == block_of(cluster, b) for a, b in replicas), replicas
