"""The failover rule between clusters: each reason, the target it picks, the limit and the
cost of a move (service/clusters/failover.py)."""

from __future__ import annotations

import dataclasses

import pytest

from service.clusters.failover import (
    SLURMCTLD_TIMEOUT_S,
    FailoverAction,
    FailoverDecision,
    FailoverReason,
    OtherCluster,
    RunCluster,
    checkpoint_copy_s,
    decide,
    failover_limit_s,
    move_cost,
)

NEED = 1280
H100 = frozenset({"h100-sxm"})
LIMIT_S = 600.0
HEALTHY = RunCluster(
    name="east",
    unreachable_for_s=None,
    healthy_nodes=NEED,
    spare_nodes=19,
    short_for_s=0.0,
    run_stepping=True,
)
SILENT = dataclasses.replace(HEALTHY, unreachable_for_s=LIMIT_S, run_stepping=False)
WEST = OtherCluster(
    name="west", hardware="h100-sxm", reachable=True, free_nodes=1300, mounts_checkpoint=True
)


def run_decide(home: RunCluster, *others: OtherCluster, **kw: object) -> FailoverDecision:
    return decide(home, list(others), need_nodes=NEED, hardware=H100, limit_s=LIMIT_S, **kw)  # type: ignore[arg-type]


def test_a_cluster_that_answers_with_enough_nodes_keeps_its_run() -> None:
    assert run_decide(HEALTHY, WEST) == FailoverDecision(
        FailoverAction.STAY, FailoverReason.CAN_RUN
    )


def test_a_silent_controller_past_the_limit_moves_the_run() -> None:
    assert run_decide(SILENT, WEST) == FailoverDecision(
        FailoverAction.FAIL_OVER, FailoverReason.CONTROLLER_UNREACHABLE, "west"
    )


def test_a_silent_controller_within_the_limit_is_waited_for() -> None:
    home = dataclasses.replace(SILENT, unreachable_for_s=LIMIT_S - 1)
    assert run_decide(home, WEST).reason == FailoverReason.WITHIN_LIMIT


def test_ranks_that_still_report_keep_the_run_however_long_the_controller_is_silent() -> None:
    home = dataclasses.replace(SILENT, unreachable_for_s=10 * LIMIT_S, run_stepping=True)
    assert run_decide(home, WEST) == FailoverDecision(
        FailoverAction.STAY, FailoverReason.STILL_STEPPING
    )


def test_too_few_healthy_nodes_with_the_spares_gone_moves_the_run_past_the_limit() -> None:
    short = dataclasses.replace(HEALTHY, healthy_nodes=NEED - 1, spare_nodes=0)
    assert run_decide(dataclasses.replace(short, short_for_s=LIMIT_S), WEST) == (
        FailoverDecision(FailoverAction.FAIL_OVER, FailoverReason.TOO_FEW_HEALTHY_NODES, "west")
    )
    assert run_decide(dataclasses.replace(short, short_for_s=LIMIT_S - 1), WEST).reason == (
        FailoverReason.WITHIN_LIMIT
    )
    # A spare left makes up the node: the run stays whatever the shortage's age.
    spare = dataclasses.replace(short, spare_nodes=1, short_for_s=LIMIT_S)
    assert run_decide(spare, WEST).reason == FailoverReason.CAN_RUN


@pytest.mark.parametrize(
    "other",
    [
        dataclasses.replace(WEST, reachable=False),
        dataclasses.replace(WEST, free_nodes=NEED - 1),
        dataclasses.replace(WEST, hardware="a100-sxm"),
        dataclasses.replace(WEST, name="east"),  # the run's own cluster is no target
    ],
    ids=["unreachable", "too_few_free", "no_layout_for_its_hardware", "itself"],
)
def test_past_the_limit_the_run_waits_when_no_other_cluster_fits(other: OtherCluster) -> None:
    assert run_decide(SILENT, other) == FailoverDecision(
        FailoverAction.WAIT, FailoverReason.NO_CLUSTER_FITS
    )


def test_a_checkpoint_that_cannot_be_read_goes_only_where_it_is_mounted() -> None:
    copied = dataclasses.replace(WEST, mounts_checkpoint=False)
    assert run_decide(SILENT, copied).target == "west"
    assert run_decide(SILENT, copied, checkpoint_readable=False).reason == (
        FailoverReason.NO_CLUSTER_FITS
    )


def test_the_target_is_one_that_mounts_the_checkpoint_then_the_one_with_most_free_nodes() -> None:
    copied = dataclasses.replace(WEST, name="north", free_nodes=5000, mounts_checkpoint=False)
    small = dataclasses.replace(WEST, name="south", free_nodes=NEED)
    assert run_decide(SILENT, copied, small, WEST).target == "west"
    assert run_decide(SILENT, copied).target == "north"


def test_the_limit_is_the_sites_else_the_copy_at_least_slurms_controller_takeover() -> None:
    assert failover_limit_s(900.0, copy_s=5000.0) == 900.0
    assert failover_limit_s(None, copy_s=0.0) == SLURMCTLD_TIMEOUT_S
    assert failover_limit_s(None, copy_s=5000.0) == 5000.0


def test_a_move_pays_the_copy_only_where_the_checkpoint_is_not_mounted() -> None:
    size = 4.86e12  # Llama 3 405B: 405e9 parameters x 12 bytes
    assert checkpoint_copy_s(size, 50e9, mounts_checkpoint=True) == 0.0
    copy = checkpoint_copy_s(size, 50e9, mounts_checkpoint=False)
    assert copy == pytest.approx(97.2)
    cost = move_cost(
        waited_s=600.0,
        resubmit_s=0.6,
        queue_start_s=0.8,
        start_and_init_s=30.0,
        restore_s=12.4,
        copy_s=copy,
        lost_work_s=1800.0,
    )
    assert cost.requeue_start_s == pytest.approx(31.4)
    assert cost.total_s == pytest.approx(600 + 31.4 + copy + 12.4 + 1800)
