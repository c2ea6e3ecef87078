"""The pure policy functions the reconciler and the failure simulation share, and the
simulation's inputs: the failure mix and the detection times it derives from settings."""

from __future__ import annotations

import itertools
import random
from collections import Counter

import pytest

from planner import reliability
from service.config import Settings
from service.models import RecoveryAction
from service.reconcile.placement import may_shrink
from service.recovery.signals import escalated_action
from service.recovery.spares import choose_new_spares
from sim import failures
from sim.policy import heartbeat_detect_s

A = RecoveryAction


def test_an_application_error_drains_only_at_the_threshold() -> None:
    assert escalated_action(A.COUNT_AND_ESCALATE, 2, 3) == A.COUNT_AND_ESCALATE
    assert escalated_action(A.COUNT_AND_ESCALATE, 3, 3) == A.DRAIN_AND_MOVE
    assert escalated_action(A.RESTART, 9, 3) == A.RESTART  # other rows stand


def test_new_spares_spread_over_leaf_switches_then_by_name() -> None:
    free = [("n4", "leaf2"), ("n1", "leaf1"), ("n2", "leaf1"), ("n5", "leaf2")]
    assert choose_new_spares(free, ["leaf1"], 2) == ["n4", "n1"]
    assert choose_new_spares(free, [], 9) == ["n1", "n4", "n2", "n5"]
    assert choose_new_spares(free, [], 0) == []


def test_a_run_shrinks_only_down_to_its_min_nodes() -> None:
    assert may_shrink(2, 3) and may_shrink(3, 3)
    assert not may_shrink(4, 3) and not may_shrink(None, 3) and not may_shrink(0, 3)
    assert not may_shrink(1, 0)


def test_a_silent_node_is_declared_dead_at_the_first_tick_past_heartbeat_dead_s() -> None:
    settings = Settings(heartbeat_dead_s=20.0, reconcile_interval_s=1.0)
    assert heartbeat_detect_s(settings) == 21.0  # silence must exceed 20 s
    assert heartbeat_detect_s(Settings(heartbeat_dead_s=30.0, reconcile_interval_s=4.0)) == 32.0


def test_failures_follow_llama_3s_rate_and_cause_mix() -> None:
    rng = random.Random(0)
    drawn = failures.draw_failures(
        rng, days=540, num_nodes=1280, gpus_per_node=8, num_leaves=80, scale=1.0
    )
    expected = reliability.DEFAULT_FAILURES_PER_GPU_HOUR * 10_240 * 540 * 24
    assert len(drawn) == pytest.approx(expected, rel=0.03)
    shares = Counter(f.cause.name for f in drawn)
    assert shares["faulty GPU"] / len(drawn) == pytest.approx(0.301 * (1 - 0.0084), abs=0.015)
    leaves = [f for f in drawn if f.leaf is not None]
    assert len(leaves) / len(drawn) == pytest.approx(failures.LEAF_SHARE, abs=0.004)
    assert all(a.at_s <= b.at_s for a, b in itertools.pairwise(drawn))
