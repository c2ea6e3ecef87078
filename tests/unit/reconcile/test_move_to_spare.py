"""A node's Xid verdict drains it and moves its run to a spare on the same leaf switch first;
with no spare the run shrinks when min_nodes allows it, and waits otherwise."""

from __future__ import annotations

from contract import StopReason
from service.models import AttemptState, IncidentState, NodeState, RunState
from tests.unit.reconcile.conftest import Cluster


def running(cluster: Cluster, *names: str, **spec: object) -> list[int]:
    ids = [cluster.submit_run(name, **spec) for name in names]
    cluster.cycle()
    for run_id in ids:
        assert cluster.run(run_id).state == RunState.RUNNING
    return ids


def test_an_xid_79_drains_the_node_and_a_spare_on_its_switch_takes_its_place(
    cluster: Cluster,
) -> None:
    cluster.set_spares(2)  # spread over the switches: unit001 (leaf1), unit004 (leaf2)
    first, second = running(cluster, "first", "second")
    assert cluster.run(second).nodes == ["unit005", "unit006"]  # on leaf2
    old_job = cluster.live_job(second)
    cluster.train(second, 20)

    cluster.xid("unit006")
    cluster.tick()

    drained = cluster.slurm.nodes["unit006"]
    assert drained.drained and drained.reason.startswith("runyard: unit006: xid:79")
    assert cluster.node("unit006").state == NodeState.DRAINED
    assert cluster.slurm.jobs[old_job].state == "CANCELLED"
    # unit001 sorts first, but unit004 shares the run's leaf switch.
    run = cluster.run(second)
    assert run.nodes == ["unit005", "unit004"]
    assert cluster.node("unit004").state == NodeState.HEALTHY
    failed, retry = cluster.attempts(second)
    assert failed.state == AttemptState.FAILED and failed.stop_reason == StopReason.NODE_FAILURE
    assert (run.num_restarts, run.num_hardware_restarts) == (1, 1)  # not counted against it
    # The spare moved into the run's reservation; the next attempt resumes from step 20.
    assert cluster.slurm.reservation_nodes[run.reservation] == ["unit004", "unit005"]
    assert retry.resume_step == 20 and retry.state == AttemptState.PENDING
    assert cluster.slurm.jobs[retry.slurm_job_id].nodelist == ("unit005", "unit004")
    (incident,) = cluster.incidents("unit006")
    assert incident.spare_node == "unit004" and incident.run_id == second
    assert cluster.run(first).nodes == ["unit002", "unit003"]  # untouched

    cluster.slurm.schedule()
    cluster.tick()
    cluster.train(second, 21)
    (incident,) = cluster.incidents("unit006")
    assert incident.state == IncidentState.RESOLVED and incident.resume_step == 20


def test_without_a_spare_a_run_that_allows_it_shrinks_to_min_nodes(cluster: Cluster) -> None:
    (run_id,) = running(cluster, "shrinks", nodes=3, min_nodes=2, global_batch=12)
    assert cluster.run(run_id).nodes == ["unit001", "unit002", "unit003"]
    cluster.slurm.run_foreign_job("others", ["unit004", "unit005", "unit006"])

    cluster.xid("unit002")
    cluster.tick()

    run = cluster.run(run_id)
    assert run.num_nodes == 2 and run.nodes == ["unit001", "unit003"]
    layout = run.config["layout"]
    assert layout["dp"] * layout["tp"] * layout["pp"] * layout["cp"] == 2  # replanned
    assert "recovery.no_spare" in cluster.events(run_id)
    assert "run.shrunk" in cluster.events(run_id)
    retry = cluster.attempts(run_id)[-1]
    assert cluster.slurm.jobs[retry.slurm_job_id].nodelist == ("unit001", "unit003")


def test_without_a_spare_or_min_nodes_the_run_waits_holding_its_healthy_nodes(
    cluster: Cluster,
) -> None:
    (run_id,) = running(cluster, "waits", nodes=3, global_batch=12)
    others = cluster.slurm.run_foreign_job("others", ["unit004", "unit005", "unit006"])

    cluster.xid("unit003")
    cluster.tick(2)

    run = cluster.run(run_id)
    assert run.state == RunState.PENDING and run.nodes == ["unit001", "unit002"]
    assert run.state_reason == "waiting for 1 free healthy node(s)"
    assert len(cluster.attempts(run_id)) == 1  # nothing submitted
    # Its healthy nodes stay in its reservation: no other job can take them meanwhile.
    assert cluster.slurm.reservation_nodes[run.reservation] == ["unit001", "unit002"]
    (incident,) = cluster.incidents("unit003")
    assert incident.state == IncidentState.WAITING

    cluster.slurm.finish(others)  # nodes free up
    cluster.tick()
    assert cluster.run(run_id).nodes == ["unit001", "unit002", "unit004"]
    assert len(cluster.attempts(run_id)) == 2


def test_slurm_losing_a_node_drains_it_and_moves_the_run(cluster: Cluster) -> None:
    cluster.set_spares(1)
    (run_id,) = running(cluster, "node-fail")
    spare = next(n for n, ns in cluster.slurm.reservation_nodes.items() if n.endswith("spares"))
    (spare_node,) = cluster.slurm.reservation_nodes[spare]
    bad = cluster.run(run_id).nodes[1]
    cluster.slurm.fail_node(bad)  # DOWN*, and the job ends NODE_FAIL
    cluster.tick(2)
    run = cluster.run(run_id)
    assert bad not in run.nodes and spare_node in run.nodes
    assert cluster.slurm.nodes[bad].drained and cluster.node(bad).state == NodeState.DRAINED
    assert cluster.incidents(bad)[0].signal == "slurm:node_down"
    assert cluster.attempts(run_id)[-1].state == AttemptState.PENDING


def test_an_ended_attempts_job_whose_scancel_was_lost_is_cancelled_next_tick(
    cluster: Cluster,
) -> None:
    """The attempt's end is committed before its job is scancelled; slurmctld did not
    answer that scancel (or the service died before it). The next tick cancels the job,
    from what Postgres says, so it does not hold the run's nodes or write checkpoints."""
    cluster.set_spares(1)
    (run_id,) = running(cluster, "lost-scancel")
    old_job = cluster.live_job(run_id)
    cluster.slurm.break_call("cancel")
    cluster.xid(cluster.run(run_id).nodes[1])
    cluster.tick()
    failed, _ = cluster.attempts(run_id)
    assert failed.state == AttemptState.FAILED and failed.slurm_job_id == old_job
    assert cluster.slurm.jobs[old_job].state == "RUNNING", "the scancel was lost"
    cluster.slurm.heal_call("cancel")
    cluster.tick()
    assert cluster.slurm.jobs[old_job].state == "CANCELLED"
    cluster.slurm.calls.clear()
    cluster.tick()
    assert cluster.slurm.calls["cancel"] == 0, "an ended job is not cancelled again"
