"""Releasing an ended run's nodes (issue 37): the run keeps its reservation, and says nothing
of a release, until Slurm has really deleted it; a run reservation of ours that no run holds
is swept away at the next tick, and no reservation of anyone else is touched."""

from __future__ import annotations

import logging

import pytest

from service.models import RunState
from service.slurm.commands import RESERVATION_BUSY
from service.slurm.reservations import spare_reservation
from tests.unit.reconcile.conftest import PREFIX, Cluster


def running(cluster: Cluster, name: str, **spec: object) -> int:
    run_id = cluster.submit_run(name, **spec)
    cluster.cycle()
    assert cluster.run(run_id).state == RunState.RUNNING
    return run_id


def succeed(cluster: Cluster, run_id: int) -> None:
    """The worker trains every step and its job exits 0: the next tick ends the run."""
    cluster.finish_training(run_id)
    cluster.slurm.finish(cluster.live_job(run_id), exit_code=0)


def test_a_refused_delete_keeps_the_run_releasing_until_slurm_deletes_its_reservation(
    cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    run_id = running(cluster, "ends-while-jobs-end")
    reservation = cluster.run(run_id).reservation
    assert reservation is not None
    # slurmctld refuses twice, as it does while a job that ran in the reservation is ending.
    cluster.slurm.refuse_reservation_delete(reservation, times=2)
    succeed(cluster, run_id)
    for tick in (1, 2):
        with caplog.at_level(logging.WARNING, logger="service.reconcile.placement"):
            cluster.tick()
        run = cluster.run(run_id)
        assert run.state == RunState.SUCCEEDED, tick
        assert run.reservation == reservation, f"tick {tick}: still releasing"
        assert reservation in cluster.slurm.reservation_nodes, tick
        assert "run.released" not in cluster.events(run_id), tick
    assert RESERVATION_BUSY in caplog.text  # the refusal is said, not swallowed
    cluster.tick()
    assert cluster.run(run_id).reservation is None
    assert reservation not in cluster.slurm.reservation_nodes
    assert cluster.events(run_id).count("run.released") == 1
    cluster.tick()  # nothing left to release: said once
    assert cluster.events(run_id).count("run.released") == 1


def test_one_refused_release_does_not_hold_up_the_others_and_frees_its_nodes_once_deleted(
    cluster: Cluster,
) -> None:
    refused = running(cluster, "refused", nodes=2)
    accepted = running(cluster, "accepted", nodes=2)
    held = cluster.run(refused).nodes
    waiting = cluster.submit_run("needs-every-node", nodes=6, global_batch=12)
    cluster.slurm.refuse_reservation_delete(f"{PREFIX}-run{refused}", times=1)
    succeed(cluster, refused)
    succeed(cluster, accepted)
    cluster.tick()
    assert cluster.run(refused).reservation is not None
    assert cluster.run(accepted).reservation is None  # released in the same tick
    assert "run.released" in cluster.events(accepted)
    assert cluster.run(waiting).nodes == []  # the refused run's nodes are not free yet
    cluster.tick(2)  # the release, then placement sees the nodes free
    assert cluster.run(refused).reservation is None
    assert set(held) < set(cluster.run(waiting).nodes)


def test_a_release_waits_while_slurm_does_not_answer(cluster: Cluster) -> None:
    run_id = running(cluster, "released-after-outage")
    reservation = cluster.run(run_id).reservation
    cluster.slurm.break_call("delete_reservation")
    succeed(cluster, run_id)
    cluster.tick(2)
    assert cluster.run(run_id).state == RunState.SUCCEEDED
    assert cluster.run(run_id).reservation == reservation
    assert "run.released" not in cluster.events(run_id)
    cluster.slurm.heal_call("delete_reservation")
    cluster.tick()
    assert cluster.run(run_id).reservation is None
    assert reservation not in cluster.slurm.reservation_nodes


def test_a_leaked_run_reservation_is_swept_and_no_one_elses_is_touched(cluster: Cluster) -> None:
    cluster.set_spares(1)
    ended = running(cluster, "ended")
    live = running(cluster, "still-running")
    succeed(cluster, ended)
    cluster.tick()
    assert cluster.run(ended).state == RunState.SUCCEEDED
    assert cluster.run(ended).reservation is None
    # What the service before the fix left behind: the run released in the database, its
    # reservation still in Slurm; and one of a run the database does not know.
    leaked, unknown = f"{PREFIX}-run{ended}", f"{PREFIX}-run{ended + 1000}"
    cluster.slurm.create_reservation(leaked, ["unit001"])
    cluster.slurm.create_reservation(unknown, ["unit002"])
    # Not ours: another service's (whose prefix starts with ours), an operator's, and a name
    # that only looks like a run's.
    others = {
        f"{PREFIX}2-run{ended}": ["unit003"],
        "maintenance": ["unit006"],
        f"{PREFIX}-run0{ended}": ["unit003"],
    }
    for name, nodes in others.items():
        cluster.slurm.create_reservation(name, nodes)
    spares = spare_reservation(PREFIX)
    kept = {
        name: cluster.slurm.reservation_nodes[name]
        for name in [*others, spares, f"{PREFIX}-run{live}"]
    }
    assert kept[spares], "the pool holds its spare"
    cluster.tick()
    assert leaked not in cluster.slurm.reservation_nodes
    assert unknown not in cluster.slurm.reservation_nodes
    for name, nodes in kept.items():
        assert cluster.slurm.reservation_nodes.get(name) == nodes, name
    assert cluster.run(live).state == RunState.RUNNING
    assert cluster.events(ended).count("run.released") == 1  # the sweep records no release
