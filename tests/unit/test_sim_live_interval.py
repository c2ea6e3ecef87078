"""The failure simulation runs the service's live checkpoint interval: at ten times the
rate the fleet was planned for, it shortens the interval the run was given and gains
goodput on the same failures; at the planned rate it stays near the planner's."""

from __future__ import annotations

from sim.engine import SimConfig, Simulation, simulate


def test_the_live_interval_follows_a_failure_rate_ten_times_the_planned_one() -> None:
    planned = Simulation(SimConfig(days=3, fast_path=False)).interval_s
    fixed = simulate(SimConfig(days=3, scale=10, fast_path=False, interval_s=planned))
    live = simulate(
        SimConfig(days=3, scale=10, fast_path=False, interval_s=planned, live_interval=True)
    )
    assert fixed.failures == live.failures  # the same failures, seed for seed
    assert live.checkpoint_interval_s < planned / 2  # sqrt(10) shorter, give or take
    assert live.goodput > fixed.goodput
    quiet = simulate(SimConfig(days=3, fast_path=False, interval_s=planned, live_interval=True))
    assert 0.7 * planned < quiet.checkpoint_interval_s < 1.3 * planned
