"""The goodput model of the fast recovery path (replica groups) against the classic one."""

from __future__ import annotations

import pytest

from planner.presets import MODEL_PRESETS
from planner.reliability import ReliabilityAssumptions, assess, fast_path_lost_s


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
