"""The goodput model of the fast recovery path (replica groups) against the classic one."""

from __future__ import annotations

import pytest

from planner.presets import MODEL_PRESETS
from planner.reliability import (
    DURABLE_CHECKPOINT_MAX_S,
    ReliabilityAssumptions,
    assess,
    fast_path_lost_s,
)


def test_a_fast_recovery_costs_the_stall_one_step_and_the_failed_groups_share() -> None:
    lost = fast_path_lost_s(
        groups=4,
        step_s=2.0,
        stall_s=4.0,
        rejoin_s=20.0,
        heal_s=4.0,
        classic_lost_s=900.0,
        mtbi_s=1e9,
    )
    assert lost == pytest.approx(4.0 + 2.0 + 24.0 / 4)


def test_with_two_groups_a_second_failure_while_one_heals_goes_classic() -> None:
    alone = fast_path_lost_s(2, 1.0, 4.0, 36.0, 0.0, 1000.0, mtbi_s=1e12)
    often = fast_path_lost_s(2, 1.0, 4.0, 36.0, 0.0, 1000.0, mtbi_s=360.0)  # 10 % classic
    assert often == pytest.approx(0.9 * alone + 0.1 * 1000.0)


def test_405b_on_10240_gpus_keeps_most_of_what_the_classic_path_loses() -> None:
    model = MODEL_PRESETS["llama3-405b"]
    plan = assess(model, 10_240, 8, step_s=10.75)
    assert plan.goodput_fast is not None and plan.replica_groups == 2
    assert plan.fast_lost_s is not None and plan.fast_lost_s < plan.classic_lost_s / 10
    assert plan.goodput < plan.goodput_fast < 1.0


def test_no_fast_path_when_the_nodes_do_not_split_into_the_groups() -> None:
    plan = assess(MODEL_PRESETS["llama3-8b"], 24, 8, 1.0, ReliabilityAssumptions(replica_groups=2))
    assert plan.goodput_fast is None and plan.replica_groups == 0
    off = assess(MODEL_PRESETS["llama3-8b"], 16, 8, 1.0, ReliabilityAssumptions(replica_groups=0))
    assert off.goodput_fast is None


def test_the_fast_path_checkpoints_for_its_classic_fallbacks_at_most_hourly() -> None:
    """Two groups of 405B on 10,240 GPUs: a failure goes classic only while the other group
    heals, so Daly's interval for that rate is long and the hour's cap decides; both
    intervals are whole steps, and a run without the fast path gets none."""
    plan = assess(MODEL_PRESETS["llama3-405b"], 10_240, 8, step_s=10.75)
    assert plan.fast_checkpoint_interval_steps == round(DURABLE_CHECKPOINT_MAX_S / 10.75)
    assert plan.fast_checkpoint_interval_s == pytest.approx(
        plan.fast_checkpoint_interval_steps * 10.75
    )
    assert plan.fast_checkpoint_interval_s > 3 * plan.checkpoint_interval_s
    assert plan.interval_s_for(fast_path=True) == plan.fast_checkpoint_interval_s
    assert plan.interval_s_for(fast_path=False) == plan.checkpoint_interval_s
    off = assess(MODEL_PRESETS["llama3-8b"], 24, 8, 1.0, ReliabilityAssumptions(replica_groups=2))
    assert off.fast_checkpoint_interval_s is None and off.fast_checkpoint_interval_steps is None
    assert off.interval_s_for(fast_path=True) == off.checkpoint_interval_s


def test_with_frequent_fallbacks_the_fast_path_interval_is_dalys_for_their_rate() -> None:
    """A slow rejoin (an hour out) at 10x Llama 3's rate: about one failure in two falls
    back to the classic path, so the fast path checkpoints more often than hourly but less
    often than the classic path."""
    a = ReliabilityAssumptions(
        failures_per_gpu_hour=10 * ReliabilityAssumptions().failures_per_gpu_hour,
        fast_rejoin_s=900.0,
    )
    plan = assess(MODEL_PRESETS["llama3-405b"], 10_240, 8, 1.0, a)
    assert plan.fast_checkpoint_interval_s is not None
    assert plan.checkpoint_interval_s < plan.fast_checkpoint_interval_s < DURABLE_CHECKPOINT_MAX_S
