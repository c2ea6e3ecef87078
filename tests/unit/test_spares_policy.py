"""The spare pool's policy for correlated failures (service/recovery/spares.py): its size
counts one leaf switch within the 1.5% cap, and spares go to whole replica groups, a
leaf's failure leaving a reserve for the independent failures that follow it."""

from __future__ import annotations

from service.recovery.spares import pool_target, reserve_for, spares_to_grant


def test_the_pool_covers_a_leaf_switch_within_the_cap() -> None:
    # 10,240 GPUs at Llama 3's rate: 11 spares for independent failures, + 16 for a leaf,
    # capped at 1.5% of 1,280 nodes.
    assert pool_target(independent=11, nodes_per_leaf=16, run_nodes=1280) == 19
    assert pool_target(independent=2, nodes_per_leaf=16, run_nodes=4000) == 18  # uncapped
    # Never under the independent failures' own need, whatever the cap.
    assert pool_target(independent=65, nodes_per_leaf=16, run_nodes=1280) == 65
    assert pool_target(independent=1, nodes_per_leaf=16, run_nodes=8) == 1


def test_the_reserve_covers_failures_until_the_switch_is_back() -> None:
    assert reserve_for(0.2) == 3  # 0.8 expected in 4 h; P(more than 3) < 1%
    assert reserve_for(0.0) == 0
    assert reserve_for(2.0) > reserve_for(0.2)


def test_one_failed_node_takes_a_spare_whenever_there_is_one() -> None:
    assert spares_to_grant({5: 1}, 1, reserve=3, others_train=True) == [5]
    assert spares_to_grant({5: 1}, 0, reserve=3, others_train=True) == []


def test_a_leaf_failure_fills_whole_groups_and_leaves_the_reserve() -> None:
    lost = {7: 12, 8: 4}  # a leaf of 16 across two replica groups of 20
    assert spares_to_grant(lost, 19, reserve=3, others_train=True) == [8, 7]
    # 15 spares: the group that lost 4 is filled; the one that lost 12 would leave 0 of 3,
    # so it waits for its switch while the other groups train (no partial fill).
    assert spares_to_grant(lost, 15, reserve=3, others_train=True) == [8]
    assert spares_to_grant(lost, 6, reserve=3, others_train=True) == []


def test_a_stopped_run_takes_every_group_the_pool_can_complete() -> None:
    # No replica groups (or the classic path): waiting would idle the whole run.
    assert spares_to_grant({0: 16}, 16, reserve=3, others_train=False) == [0]
    assert spares_to_grant({0: 16}, 15, reserve=3, others_train=False) == []
