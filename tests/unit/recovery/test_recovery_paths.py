"""The recovery-path policy: which failures the fast path covers, and why not the others."""

from __future__ import annotations

import pytest

from service.models import ClassicBecause, RecoveryPath
from service.recovery.paths import choose_recovery_path


def test_one_failed_group_of_two_takes_the_fast_path() -> None:
    assert choose_recovery_path(replica_groups=2, failed_groups=[1]) == (RecoveryPath.FAST, None)


def test_a_run_without_replicas_takes_the_classic_path() -> None:
    path, why = choose_recovery_path(replica_groups=1, failed_groups=[0])
    assert (path, why) == (RecoveryPath.CLASSIC, ClassicBecause.NO_REPLICAS)


def test_every_group_failing_at_once_leaves_no_copy_to_heal_from() -> None:
    path, why = choose_recovery_path(replica_groups=2, failed_groups=[0, 1])
    assert (path, why) == (RecoveryPath.CLASSIC, ClassicBecause.ALL_COPIES_LOST)


def test_two_of_four_groups_fail_fast_unless_three_must_stay_healthy() -> None:
    assert choose_recovery_path(replica_groups=4, failed_groups=[0, 2])[0] is RecoveryPath.FAST
    path, why = choose_recovery_path(replica_groups=4, failed_groups=[0, 2], min_healthy_groups=3)
    assert (path, why) == (RecoveryPath.CLASSIC, ClassicBecause.TOO_FEW_HEALTHY_GROUPS)


def test_a_group_reported_twice_counts_once() -> None:
    assert choose_recovery_path(replica_groups=3, failed_groups=[1, 1], min_healthy_groups=2) == (
        RecoveryPath.FAST,
        None,
    )


def test_a_lost_lighthouse_or_stopped_survivors_fall_back_to_disk() -> None:
    assert choose_recovery_path(replica_groups=2, failed_groups=[0], lighthouse_alive=False) == (
        RecoveryPath.CLASSIC,
        ClassicBecause.LIGHTHOUSE_LOST,
    )
    assert choose_recovery_path(replica_groups=2, failed_groups=[0], survivors_stepping=False) == (
        RecoveryPath.CLASSIC,
        ClassicBecause.SURVIVORS_STOPPED_DURING_SERVICE_RESTART,
    )


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"replica_groups": 0, "failed_groups": [0]}, "replica_groups"),
        ({"replica_groups": 2, "failed_groups": []}, "failed_groups"),
        ({"replica_groups": 2, "failed_groups": [2]}, "failed_groups"),
        (
            {"replica_groups": 2, "failed_groups": [0], "min_healthy_groups": 0},
            "min_healthy_groups",
        ),
    ],
)
def test_bad_input_names_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        choose_recovery_path(**kwargs)  # type: ignore[arg-type]
