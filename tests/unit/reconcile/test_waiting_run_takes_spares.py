"""A run that found no spare when its node failed takes a spare as soon as the pool holds
one, instead of waiting until the pool is full again (the failure simulation, sim/, found
the pool refilling first cost the classic path a third of a 30-day run)."""

from __future__ import annotations

from service.models import NodeState, RunState
from service.reconcile.placement import nodes_for_run
from tests.unit.reconcile.conftest import Cluster


def test_a_waiting_run_takes_the_spare_the_pool_refilled_with(cluster: Cluster) -> None:
    run_id = cluster.submit_run("waits", nodes=3, global_batch=12)
    cluster.cycle()
    assert cluster.run(run_id).state == RunState.RUNNING
    first = cluster.slurm.run_foreign_job("first", ["unit004"])
    cluster.slurm.run_foreign_job("others", ["unit005", "unit006"])
    cluster.xid("unit003")  # no spare, no free node: the run waits
    cluster.tick(2)
    assert cluster.run(run_id).nodes == ["unit001", "unit002"]
    cluster.set_spares(1)

    cluster.slurm.finish(first)  # unit004 frees up; the spares step takes it first
    cluster.tick()

    run = cluster.run(run_id)
    assert run.nodes == ["unit001", "unit002", "unit004"]
    assert cluster.node("unit004").state == NodeState.HEALTHY
    assert len(cluster.attempts(run_id)) == 2  # resubmitted on the spare


def test_only_a_run_that_lost_nodes_takes_spares_and_free_nodes_come_first() -> None:
    free = [("n1", "leaf1")]
    spares = [("s1", "leaf1"), ("s2", "leaf2")]
    assert nodes_for_run(free, set(), 2, spares) is None  # a new run never takes spares
    assert nodes_for_run(free, {"leaf1"}, 1, spares) == ["n1"]  # free first
    assert nodes_for_run(free, {"leaf1"}, 2, spares) == ["n1", "s1"]  # its switch first
    assert nodes_for_run([], {"leaf2"}, 1, spares) == ["s2"]


def test_a_queued_run_is_not_rewritten_when_the_free_count_changes(cluster: Cluster) -> None:
    """With 10,000 runs queued, a reason that named the free count re-wrote all of them
    whenever a node freed up (bench/reconciler_scale.py)."""
    run_id = cluster.submit_run("too-big", nodes=8)
    cluster.tick()
    assert cluster.run(run_id).state_reason == "waiting for 8 free healthy node(s)"
    cluster.slurm.run_foreign_job("others", ["unit004"])  # 5 free instead of 6
    cluster.tick(2)
    assert cluster.run(run_id).state_reason == "waiting for 8 free healthy node(s)"
    assert cluster.events(run_id).count("run.waiting") == 1
