"""The simulation on two clusters with whole-cluster outages (sim/outages.py): the run moves
when the service's failover rule says so (service/clusters/failover.py), and only then; a
run on one cluster meets the same outages and waits them out."""

from __future__ import annotations

import dataclasses

import pytest

from service.clusters import failover
from sim.engine import SimConfig, Simulation, simulate
from sim.ledger import Use
from sim.outages import draw_outages

# Seed 1 at 10x the published rate: a 6-hour PDU failure of the run's cluster at hour 443,
# an overheating of it at hour 596, and one of the other cluster at hour 105.
WITH = SimConfig(days=30, seed=1, clusters=2, outage_scale=10)
WITHOUT = dataclasses.replace(WITH, clusters=1)


def test_the_outages_of_the_runs_cluster_are_the_same_with_a_second_cluster_or_without() -> None:
    one = draw_outages(1, days=30, clusters=1, scale=10)
    two = draw_outages(1, days=30, clusters=2, scale=10)
    assert one and one == [o for o in two if o.cluster == 0]


def test_failover_moves_the_run_and_beats_waiting_the_outage_out() -> None:
    moved, waited = simulate(WITH), simulate(WITHOUT)
    assert len(moved.moves) == 1 and not waited.moves
    assert moved.decisions["too_few_healthy_nodes"] == 1
    assert waited.decisions == {"no_cluster_fits": 2}
    assert waited.badput["cluster_down"] > 0.05
    assert moved.badput["cluster_down"] < 1e-3 and moved.badput["failover"] > 0
    assert moved.goodput > waited.goodput + 0.05


def test_the_move_is_the_services_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    stay = failover.FailoverDecision(
        failover.FailoverAction.WAIT, failover.FailoverReason.WITHIN_LIMIT
    )
    monkeypatch.setattr(failover, "decide", lambda *a, **kw: stay)
    result = simulate(WITH)
    assert not result.moves and result.decisions == {"within_limit": result.outages_hit}
    assert result.badput["cluster_down"] > 0.05


def test_no_move_where_the_other_cluster_has_too_few_free_nodes() -> None:
    result = simulate(dataclasses.replace(WITH, other_free_nodes=100))
    assert not result.moves and result.decisions["no_cluster_fits"] >= 1


def test_an_outage_shorter_than_the_sites_limit_is_waited_out() -> None:
    # A failover_after_s of 7 h outlasts the 6-hour PDU failure (the run restarts at home),
    # not the overheating after it: its silent controller moves the run.
    result = simulate(dataclasses.replace(WITH, failover_after_s=7 * 3600))
    assert result.failover_limit_s == 7 * 3600 and result.outages_hit == 2
    assert result.decisions == {"controller_unreachable": 1}
    assert len(result.moves) == 1 and result.moves[0].detection_s > 7 * 3600


def test_a_copied_checkpoint_costs_the_move_its_copy() -> None:
    shared = simulate(WITH)
    copied = simulate(dataclasses.replace(WITH, shared_checkpoint=False))
    assert shared.moves[0].checkpoint_copy_s == 0
    assert copied.moves[0].checkpoint_copy_s == pytest.approx(copied.costs.checkpoint_copy_s)
    assert copied.costs.checkpoint_copy_s > 60  # 4.9 TB at 50 GB/s
    assert copied.badput["failover"] > shared.badput["failover"]


def test_every_second_is_accounted_for_across_outages_and_a_move() -> None:
    sim = Simulation(WITH)
    result = sim.simulate()
    assert result.moves
    assert sum(sim.ledger.total(u) for u in Use) == pytest.approx(sim.horizon, rel=1e-9)
    assert all(v >= -1e-6 for v in result.badput.values())


def test_without_outages_a_second_cluster_changes_nothing() -> None:
    base = SimConfig(days=4, seed=2, scale=3)
    one, two = simulate(base), simulate(dataclasses.replace(base, clusters=2))
    assert (one.goodput, one.badput) == (two.goodput, two.badput)
