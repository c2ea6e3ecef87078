"""Placement and submission: a run gets free healthy nodes on the fewest leaf switches, holds
them in its own reservation, and is sbatched once; Slurm traffic per tick stays bounded."""

from __future__ import annotations

from service.models import AttemptState, RunState
from tests.unit.reconcile.conftest import PREFIX, Cluster


def test_a_run_is_placed_on_one_switch_held_in_its_reservation_and_followed(
    cluster: Cluster,
) -> None:
    run_id = cluster.submit_run("placed")
    cluster.tick()
    run = cluster.run(run_id)
    assert run.nodes == ["unit001", "unit002"]  # best fit: one switch, name order
    assert run.reservation == f"{PREFIX}-run{run_id}"
    assert cluster.slurm.reservation_nodes[run.reservation] == ["unit001", "unit002"]
    (job,) = cluster.slurm.jobs.values()
    assert job.name == f"{PREFIX}-r{run_id}-a{cluster.attempts(run_id)[0].id}"
    assert job.nodelist == ("unit001", "unit002") and job.reservation == run.reservation
    assert cluster.attempts(run_id)[0].state == AttemptState.PENDING
    assert cluster.slurm.schedule() == [job.job_id]
    cluster.tick()
    attempt = cluster.attempts(run_id)[0]
    assert attempt.state == AttemptState.RUNNING and cluster.run(run_id).state == RunState.RUNNING
    assert attempt.node_list == "unit[001-002]" and attempt.nodes == ["unit001", "unit002"]
    assert cluster.events(run_id)[:4] == [
        "run.submitted",
        "run.placed",
        "attempt.submitting",
        "attempt.pending",
    ]


def test_a_second_run_goes_to_the_other_switch_rather_than_straddle(cluster: Cluster) -> None:
    first, second = cluster.submit_run("first"), cluster.submit_run("second")
    cluster.tick()
    assert cluster.run(first).nodes == ["unit001", "unit002"]
    assert cluster.run(second).nodes == ["unit004", "unit005"]


def test_with_too_few_free_nodes_a_run_waits_and_says_why(cluster: Cluster) -> None:
    run_id = cluster.submit_run("too-big", nodes=8)
    cluster.tick(2)
    run = cluster.run(run_id)
    assert run.state == RunState.PENDING and run.nodes == [] and run.attempts == []
    assert run.state_reason == "waiting for 8 free healthy node(s)"
    assert cluster.events(run_id).count("run.waiting") == 1  # said once, not every tick
    assert cluster.slurm.calls["submit"] == 0


def test_a_tick_costs_the_same_slurm_calls_for_one_run_or_three(cluster: Cluster) -> None:
    """The reconciler's Slurm traffic does not grow with the number of jobs it watches."""

    def steady_tick_calls() -> int:
        cluster.slurm.calls.clear()
        cluster.tick()
        return sum(cluster.slurm.calls.values())

    cluster.submit_run("one")
    cluster.cycle()
    with_one = steady_tick_calls()
    cluster.submit_run("two", nodes=1)
    cluster.submit_run("three", nodes=1)
    cluster.cycle()
    with_three = steady_tick_calls()
    # scontrol show node, show reservation, squeue, and the delete of the empty spare pool's
    # reservation that maintain_spares repeats each tick while the target is 0.
    assert with_one == with_three == 4, cluster.slurm.calls
