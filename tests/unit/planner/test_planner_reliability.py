"""Failure rate, Young/Daly interval, goodput and the Poisson spare-pool rule."""

from __future__ import annotations

import math

import pytest

from planner.presets import MODEL_PRESETS
from planner.reliability import (
    DEFAULT_FAILURES_PER_GPU_HOUR,
    assess,
    checkpoint_interval_s,
    expected_goodput,
    spares_needed,
)


def test_default_rate_reproduces_llama3_interruptions() -> None:
    # 419 interruptions in 54 days on 16,384 GPUs: one every ~3.1 hours.
    hours = 54 * 24
    assert DEFAULT_FAILURES_PER_GPU_HOUR * 16_384 * hours == pytest.approx(419)
    plan = assess(MODEL_PRESETS["llama3-8b"], 16_384, 8, step_s=5.0)
    assert plan.mtbi_s / 3600 == pytest.approx(hours / 419)


def test_daly_interval_is_young_plus_small_corrections() -> None:
    write_s, mtbi_s = 60.0, 4 * 3600.0
    young = math.sqrt(2 * write_s * mtbi_s)
    ratio = write_s / (2 * mtbi_s)
    expected = young * (1 + math.sqrt(ratio) / 3 + ratio / 9) - write_s
    assert checkpoint_interval_s(write_s, mtbi_s) == pytest.approx(expected)
    assert young - write_s < expected < young


def test_daly_interval_caps_at_mtbi_when_checkpoints_are_slow() -> None:
    assert checkpoint_interval_s(write_s=5000.0, mtbi_s=2000.0) == 2000.0


def test_daly_interval_maximises_goodput() -> None:
    write_s, restart_s, mtbi_s = 30.0, 600.0, 5 * 3600.0
    best = checkpoint_interval_s(write_s, mtbi_s)
    at_best = expected_goodput(best, write_s, restart_s, mtbi_s)
    for factor in (0.5, 0.8, 1.25, 2.0):
        assert expected_goodput(best * factor, write_s, restart_s, mtbi_s) < at_best


def test_goodput_without_failures_is_the_checkpoint_duty_cycle() -> None:
    assert expected_goodput(90.0, 10.0, 600.0, math.inf) == pytest.approx(0.9)


@pytest.mark.parametrize(("mean", "spares"), [(0.0, 0), (1.0, 4), (4.85, 11)])
def test_spare_pool_keeps_running_out_below_one_percent(mean: float, spares: int) -> None:
    assert spares_needed(mean, 0.01) == spares

    def p_more_than(s: int) -> float:
        return 1 - sum(math.exp(-mean) * mean**k / math.factorial(k) for k in range(s + 1))

    assert p_more_than(spares) < 0.01
    if spares:
        assert p_more_than(spares - 1) >= 0.01


def test_assess_sizes_checkpoint_and_spares_for_405b() -> None:
    plan = assess(MODEL_PRESETS["llama3-405b"], 10_240, 8, step_s=10.0)
    assert plan.checkpoint_bytes == MODEL_PRESETS["llama3-405b"].num_params * 12
    assert plan.checkpoint_interval_s == plan.checkpoint_interval_steps * 10.0
    assert 0.9 < plan.goodput < 1.0
    assert plan.spare_nodes == 11  # Poisson mean 1,280 nodes x 8 x rate x 24 h = 4.85


def test_the_interval_weighs_what_a_save_costs_training_not_its_write() -> None:
    """Young/Daly trade the save's cost to training (its stall: blocking plus the excess of
    the steps beside it) against lost work; the rest of the write overlaps training and
    only makes the checkpoint durable later. A stall share of 1.0 is a synchronous save,
    the model as it was."""
    from planner.reliability import ReliabilityAssumptions

    model, step_s = MODEL_PRESETS["llama3-405b"], 11.0
    sync = assess(model, 10_240, 8, step_s, ReliabilityAssumptions(checkpoint_stall_share=1.0))
    hidden = assess(model, 10_240, 8, step_s, ReliabilityAssumptions(checkpoint_stall_share=0.2))
    write_s, mtbi_s = sync.checkpoint_write_s, sync.mtbi_s
    assert hidden.checkpoint_write_s == write_s
    assert sync.checkpoint_stall_s == write_s
    assert hidden.checkpoint_stall_s == pytest.approx(0.2 * write_s)
    # The interval is Daly's for the stall, in whole steps...
    for rel in (sync, hidden):
        ideal = checkpoint_interval_s(rel.checkpoint_stall_s, mtbi_s)
        assert rel.checkpoint_interval_s == pytest.approx(ideal, abs=step_s / 2)
    assert hidden.checkpoint_interval_s < sync.checkpoint_interval_s
    # ...and goodput charges the stall per cycle, and the write's latency per interruption.
    restart_s = ReliabilityAssumptions().restart_s + write_s
    assert sync.goodput == pytest.approx(
        expected_goodput(sync.checkpoint_interval_s, write_s, restart_s, mtbi_s)
    )
    stall_s = hidden.checkpoint_stall_s
    assert hidden.goodput == pytest.approx(
        expected_goodput(
            hidden.checkpoint_interval_s, stall_s, restart_s, mtbi_s, write_s - stall_s
        )
    )
    assert hidden.goodput > sync.goodput


def test_the_next_save_starts_no_sooner_than_the_last_is_written() -> None:
    """A save that costs training almost nothing would make Daly's interval shorter than
    the write itself: one save in flight at a time, the interval is at least the write."""
    from planner.reliability import ReliabilityAssumptions

    rel = assess(
        MODEL_PRESETS["llama3-405b"],
        10_240,
        8,
        1.0,
        ReliabilityAssumptions(checkpoint_stall_share=1e-6),
    )
    assert rel.checkpoint_interval_s >= rel.checkpoint_write_s - rel.checkpoint_stall_s
