"""The failure simulation (sim/) decides through the service's own policy functions: replace
one and a simulated result changes. It is deterministic for a seed and accounts for every
second of the run's allocation. A few simulated days each: seconds of wall time."""

from __future__ import annotations

import dataclasses

import pytest

from planner import reliability
from service.models import RecoveryAction
from service.reconcile import placement as run_placement
from service.recovery import classification, paths, spares
from service.slurm import node_choice
from sim.engine import SimConfig, SimResult, Simulation, simulate
from sim.ledger import Use
from sim.run_shape import planned_run

DAYS = 4.0


def figures(r: SimResult) -> tuple[object, ...]:
    return (r.goodput, r.badput, dict(r.recoveries), r.worst_hour, r.drained, r.failures)


def test_the_same_seed_gives_the_same_run_and_another_seed_another() -> None:
    config = SimConfig(days=DAYS, scale=3, seed=7)
    assert figures(simulate(config)) == figures(simulate(config))
    other = simulate(dataclasses.replace(config, seed=8))
    assert figures(other) != figures(simulate(config))


@pytest.mark.parametrize("fast_path", [True, False])
def test_every_second_of_the_allocation_is_accounted_for(fast_path: bool) -> None:
    sim = Simulation(SimConfig(days=DAYS, scale=10, pool=5, fast_path=fast_path, seed=1))
    result = sim.simulate()
    total = sum(sim.ledger.total(u) for u in Use)
    assert total == pytest.approx(sim.horizon, rel=1e-9)
    assert result.goodput == pytest.approx(1 - sum(result.badput.values()), abs=1e-9)
    assert all(v >= -1e-6 for v in result.badput.values())


def test_the_spare_choice_is_the_services(monkeypatch: pytest.MonkeyPatch) -> None:
    config = SimConfig(days=DAYS, scale=3, seed=2)
    before = simulate(config)
    assert before.spares_used > 0 and before.nodes_without_spare == 0
    monkeypatch.setattr(node_choice, "choose_replacement", lambda spares, keep: None)
    after = simulate(config)
    assert after.spares_used == 0 and after.nodes_without_spare == before.drained
    assert after.badput["waiting_spare"] > before.badput["waiting_spare"]


def test_the_checkpoint_interval_is_the_planners(monkeypatch: pytest.MonkeyPatch) -> None:
    config = SimConfig(days=DAYS, scale=3, fast_path=False, seed=3)
    before = simulate(config)
    daly = reliability.checkpoint_interval_s
    monkeypatch.setattr(reliability, "checkpoint_interval_s", lambda d, m: 4 * daly(d, m))
    after = simulate(config)
    assert after.checkpoint_interval_s > 3 * before.checkpoint_interval_s
    assert after.badput["recompute"] > before.badput["recompute"]  # more work lost per restore


def test_a_fast_path_run_checkpoints_at_the_planners_fast_path_interval(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run = planned_run()
    assumptions = reliability.ReliabilityAssumptions(replica_groups=run.replica_groups)
    rel = reliability.assess(run.model, run.num_gpus, 8, run.step_s, assumptions)
    assert rel.fast_checkpoint_interval_s is not None
    config = SimConfig(days=DAYS, seed=3)
    fast = simulate(config)
    classic = simulate(dataclasses.replace(config, fast_path=False))
    assert fast.checkpoint_interval_s == rel.fast_checkpoint_interval_s
    assert classic.checkpoint_interval_s == rel.checkpoint_interval_s
    assert fast.checkpoint_interval_s > 3 * classic.checkpoint_interval_s
    # The fast path's cap is the planner's: halve it and the simulated run stalls for
    # checkpoints twice as often.
    monkeypatch.setattr(reliability, "DURABLE_CHECKPOINT_MAX_S", 1800.0)
    capped = simulate(config)
    assert capped.checkpoint_interval_s == pytest.approx(1800.0, abs=run.step_s)
    assert capped.badput["checkpoint"] > 1.5 * fast.badput["checkpoint"]


def test_the_spare_pool_size_is_the_planners(monkeypatch: pytest.MonkeyPatch) -> None:
    config = SimConfig(days=DAYS, seed=4)
    # Llama 3's rate, 1,280 nodes, 24 h repairs: 11 for independent failures (the
    # planner), + 16 for a leaf switch, capped at 1.5% of the nodes (spares.pool_target).
    assert simulate(config).pool_size == 19
    assert simulate(dataclasses.replace(config, leaf_aware=False)).pool_size == 11
    monkeypatch.setattr(reliability, "spares_needed", lambda expected, risk: 2)
    assert simulate(config).pool_size == 18
    assert simulate(dataclasses.replace(config, leaf_aware=False)).pool_size == 2
    monkeypatch.setattr(spares, "pool_target", lambda **kw: 7)
    assert simulate(config).pool_size == 7


def test_a_leaf_failure_leaves_spares_for_the_failures_after_it() -> None:
    """Seed 0 at Llama 3's rate has a leaf switch fail under the run: with the planner's
    11 spares handed out node by node, a later one-node failure found none; the leaf-aware
    policy (19 spares, whole groups, a reserve) keeps one for it and waits less. The run is
    split into 64 groups (pinned): with the planner's 2 halves a leaf's group waits for
    its switch under either policy."""
    config = SimConfig(days=30, seed=0)
    run = planned_run(replica_groups=64)
    before = simulate(dataclasses.replace(config, leaf_aware=False), run)
    after = simulate(config, run)
    assert before.leaf_failures == after.leaf_failures == 1
    assert before.single_found_none and not after.single_found_none
    assert after.badput["waiting_spare"] < before.badput["waiting_spare"]


def test_which_groups_get_spares_is_the_services(monkeypatch: pytest.MonkeyPatch) -> None:
    config = SimConfig(days=DAYS, scale=3, seed=2)
    before = simulate(config)
    assert before.spares_used > 0
    monkeypatch.setattr(spares, "spares_to_grant", lambda *a, **kw: [])
    after = simulate(config)
    assert after.spares_used == 0 and after.nodes_without_spare == after.drained
    assert after.badput["waiting_spare"] > before.badput["waiting_spare"]


def test_whether_to_drain_is_the_classification_tables(monkeypatch: pytest.MonkeyPatch) -> None:
    config = SimConfig(days=DAYS, scale=3, seed=5)
    before = simulate(config)
    restart = classification.Rule(RecoveryAction.RESTART, "test: restart in place")
    rules = {k: restart for k in classification.DEFAULT_RULES}
    monkeypatch.setattr(classification, "DEFAULT_RULES", rules)
    after = simulate(config)
    assert before.drained > 0 and after.drained == 0
    # Restarted on nodes that are still broken: the groups on them never come back.
    assert after.goodput < before.goodput


def test_the_recovery_path_is_the_services(monkeypatch: pytest.MonkeyPatch) -> None:
    config = SimConfig(days=DAYS, scale=3, seed=6)
    fast = simulate(config)
    assert fast.recoveries["fast"] == fast.failures
    monkeypatch.setattr(
        paths,
        "choose_recovery_path",
        lambda **kw: (paths.RecoveryPath.CLASSIC, paths.ClassicBecause.NO_REPLICAS),
    )
    forced = simulate(config)
    # The same run on the classic path alone, checkpointing as often as the fast path's run.
    classic_only = simulate(
        dataclasses.replace(config, fast_path=False, interval_s=fast.checkpoint_interval_s)
    )
    assert forced.recoveries["fast"] == 0
    assert forced.goodput == classic_only.goodput < fast.goodput


def test_shrinking_is_the_services_decision(monkeypatch: pytest.MonkeyPatch) -> None:
    config = SimConfig(days=DAYS, scale=3, pool=0, fast_path=False, min_nodes=1200, seed=7)
    assert simulate(config).recoveries["shrink"] > 0
    monkeypatch.setattr(run_placement, "may_shrink", lambda min_nodes, held: False)
    assert simulate(config).recoveries["shrink"] == 0
