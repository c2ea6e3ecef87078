"""The recovery comparison's arithmetic on synthetic metric rows (the bench's pure part)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import pytest

from bench.recovery_compare import figures

T0 = 1_800_000_000.0  # an epoch second


def report(attempt: int, steps: range, sent: float, step_s: float) -> list[dict[str, Any]]:
    at = datetime.fromtimestamp(sent, UTC).isoformat()
    return [
        {"attempt_id": attempt, "step": s, "recorded_at": at, "step_time_s": step_s} for s in steps
    ]


def test_classic_path_loses_every_rank_until_a_step_past_the_failure() -> None:
    rows = report(1, range(1, 11), T0 + 10, 1.0)  # steps 1..10 finished at T0+1 .. T0+10
    rows += report(1, range(11, 12), T0 + 11, 1.0)  # trains on until its scancel: wasted
    rows += report(2, range(6, 13), T0 + 40, 1.0)  # resumed from step 5: 6..12, 11 at T0+39
    got = figures(
        rows, T0 + 10.5, ranks=4, failed_ranks=4, failed=1, replacement=None, from_disk={2}
    )
    assert got["step_at_xid"] == 10 and got["steps_recomputed"] == 5  # 6..10 again
    assert got["xid_to_next_productive_step_s"] == pytest.approx(28.5)
    assert got["gpu_s_lost"] == pytest.approx(4 * 28.5, abs=0.1)


def test_fast_path_counts_the_survivors_stall_and_the_failed_groups_absence() -> None:
    rows = []
    for group in (1, 2):  # two groups of 2 ranks, a step a second, reports of 5 steps
        rows += report(group, range(1, 6), T0 + 5, 1.0)
    rows += report(1, range(6, 11), T0 + 13, 1.6)  # survivor: 3 s of stall in this window
    rows += report(2, range(6, 7), T0 + 6, 1.0)  # the failed group's last report
    rows += report(3, range(11, 13), T0 + 15, 1.0)  # the replacement healed, trains 11, 12
    rows += report(1, range(11, 13), T0 + 21, 1.0)  # the survivor reports past the rejoin
    got = figures(rows, T0 + 6.5, ranks=4, failed_ranks=2, failed=2, replacement=3, from_disk=set())
    assert got["survivors_stall_s"] == pytest.approx(3.0)
    assert got["steps_recomputed"] == 0
    # The failed group's GPUs are lost until the replacement's first report (T0 + 15), not
    # its first step dated back from that report's mean step time.
    assert got["gpu_s_lost"] == pytest.approx(2 * 3.0 + 2 * (T0 + 15 - (T0 + 6.5)), abs=0.1)
