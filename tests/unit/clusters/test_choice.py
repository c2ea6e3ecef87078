"""The placement rule between clusters (service/clusters/choice.py), one test per rule: each
one fails when its rule is taken out of `_rank` or `choose_cluster`."""

from __future__ import annotations

import dataclasses
import math

import pytest

from service.clusters.choice import (
    ChoiceReason,
    ClusterOption,
    Unfit,
    choose_cluster,
    goodput_with_spares,
    why_chosen,
)

# A plan of 4 nodes: 1.0 s a step, 95 % goodput, an interruption every 100 h, 1 spare.
BASE = ClusterOption(
    name="a",
    need_nodes=4,
    unfit=None,
    step_time_s=1.0,
    goodput=0.95,
    mtbi_h=100.0,
    spares_needed=1,
    num_spares=1,
    free_nodes=4,
)


def option(**fields: object) -> ClusterOption:
    return dataclasses.replace(BASE, **fields)  # type: ignore[arg-type]


def test_a_cluster_that_cannot_run_the_spec_is_never_chosen() -> None:
    fast_but_silent = option(name="a", step_time_s=0.1, unfit=Unfit.UNREACHABLE)
    slow = option(name="b", step_time_s=2.0)
    choice = choose_cluster([fast_but_silent, slow])
    assert choice is not None
    assert (choice.chosen.name, choice.reason) == ("b", ChoiceReason.ONLY_ONE)
    assert choose_cluster([fast_but_silent]) is None


def test_starting_now_beats_a_faster_cluster_that_must_wait() -> None:
    waits = option(name="a", step_time_s=0.5, free_nodes=3)  # 3 free, the spec needs 4
    starts = option(name="b", step_time_s=1.0, free_nodes=4)
    choice = choose_cluster([waits, starts])
    assert choice is not None
    assert (choice.chosen.name, choice.reason) == ("b", ChoiceReason.STARTS_NOW)
    assert "can start now" in why_chosen(choice)


def test_the_shorter_step_wins_between_clusters_that_both_start_now() -> None:
    slow = option(name="a", step_time_s=1.2)
    fast = option(name="b", step_time_s=0.8)
    choice = choose_cluster([slow, fast])
    assert choice is not None
    assert (choice.chosen.name, choice.reason) == ("b", ChoiceReason.FASTER)


def test_the_cluster_with_the_spares_wins_at_the_same_step_time() -> None:
    # No spare and no free node beyond the run's own: failures wait for a repair.
    bare = option(name="a", num_spares=0, free_nodes=4, mtbi_h=10.0)
    spared = option(name="b", num_spares=1, free_nodes=4, mtbi_h=10.0)
    assert bare.expected_goodput < spared.expected_goodput == spared.goodput
    choice = choose_cluster([bare, spared])
    assert choice is not None
    assert (choice.chosen.name, choice.reason) == ("b", ChoiceReason.FASTER)
    assert "goodput" in why_chosen(choice)


def test_equal_clusters_are_told_apart_by_name_whatever_the_order() -> None:
    for options in ([option(name="b"), option(name="a")], [option(name="a"), option(name="b")]):
        choice = choose_cluster(options)
        assert choice is not None
        assert (choice.chosen.name, choice.reason) == ("a", ChoiceReason.NAME)


def test_free_nodes_beyond_the_runs_own_count_as_spares() -> None:
    # No pool, but two free nodes besides the four the run takes: placement takes them.
    assert option(num_spares=0, free_nodes=6).spares_for_run == 2
    assert option(num_spares=0, free_nodes=6).expected_goodput == BASE.goodput


def test_goodput_with_spares_keeps_the_plans_with_enough_and_falls_with_fewer() -> None:
    assert goodput_with_spares(0.9, 50.0, spares=2, spares_needed=2) == 0.9
    one_short = goodput_with_spares(0.9, 50.0, spares=1, spares_needed=2)
    none = goodput_with_spares(0.9, 50.0, spares=0, spares_needed=2)
    assert 0 < none < one_short < 0.9
    # No spare: E[N] = 24 h / 50 h = 0.48 failures a repair window, half a window each.
    assert none == pytest.approx(0.9 * (1 - 0.48 / 2))
    # A run interrupted every hour without a spare loses everything to waiting.
    assert goodput_with_spares(0.9, 1.0, spares=0, spares_needed=3) == 0.0
    assert goodput_with_spares(0.9, math.inf, spares=0, spares_needed=1) == 0.9
