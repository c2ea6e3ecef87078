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
    with pytest.raises(ValueError, match="not reported past the recovery"):
        figures(rows, T0 + 10.5, T0 + 11.5, ranks=4, replacement=None, from_disk={2})
    rows += report(2, range(13, 26), T0 + 53, 1.0)  # back at its pace: 13..25
    got = figures(rows, T0 + 10.5, T0 + 11.5, ranks=4, replacement=None, from_disk={2})
    assert got["step_at_xid"] == 10 and got["steps_recomputed"] == 5  # 6..10 again
    assert got["xid_to_next_productive_step_s"] == pytest.approx(28.5)
    # Counted to 10 s past the next productive step (T0 + 49): 38.5 s on 4 ranks, less the
    # 11 new steps finished meanwhile (11..21; 11 by the resumed attempt, not the doomed one).
    assert got["gpu_s_lost"] == pytest.approx(4 * (38.5 - 11 * 1.0), abs=0.1)


def test_the_doomed_attempts_steps_wait_for_the_restart_to_redo_them() -> None:
    rows = report(1, range(1, 11), T0 + 10, 1.0)
    rows += report(1, range(11, 13), T0 + 12, 1.0)  # trains 11, 12 before its scancel
    rows += report(2, range(6, 9), T0 + 40, 1.0)  # the restart's first post: 6..8
    rows += report(3, range(1, 2), T0 + 60, 1.0)  # (any later post: the lag is not the issue)
    with pytest.raises(ValueError, match="not caught up"):
        figures(rows, T0 + 10.5, T0 + 12.5, ranks=4, replacement=None, from_disk={2})


def test_fast_path_counts_the_failed_groups_absence_and_the_survivors_stall() -> None:
    rows = []
    for group in (1, 2):  # two groups of 2 ranks, a step a second, reports of 5 steps
        rows += report(group, range(1, 6), T0 + 5, 1.0)
    rows += report(2, range(6, 7), T0 + 6, 1.0)  # the failed group's last report
    # The survivor trains both shares (2 s a step) after a 2 s stall: 7, 8, 9 by T0 + 14.
    rows += report(1, range(6, 10), T0 + 14, 2.0)
    rows += report(3, range(10, 12), T0 + 15, 1.0)  # the replacement healed: 10, 11
    with pytest.raises(ValueError, match="not reported past the recovery"):
        figures(rows, T0 + 6.5, T0 + 7.5, ranks=4, replacement=3, from_disk=set())
    rows += report(1, range(10, 26), T0 + 30, 1.0)  # both at the usual pace again
    got = figures(rows, T0 + 6.5, T0 + 7.5, ranks=4, replacement=3, from_disk=set())
    assert got["steps_recomputed"] == 0 and got["step_at_xid"] == 6
    assert got["xid_to_recovered_s"] == pytest.approx(8.5)  # the replacement's first report
    # 4 ranks from the Xid to 10 s past that report (18.5 s), less the 14 new steps (7..20)
    # finished by T0 + 25, each worth the usual second on every rank: about the failed
    # group's 2 ranks out from T0 + 6.5 to its step at T0 + 14, and the survivor's stall.
    assert got["gpu_s_lost"] == pytest.approx(4 * (18.5 - 14 * 1.0), abs=0.1)
    # Had the failed attempt been ended only at T0 + 10.5, the survivor's step 7 (T0 + 10)
    # would have been trained beside a dead GPU's ranks: it does not count.
    late = figures(rows, T0 + 6.5, T0 + 10.5, ranks=4, replacement=3, from_disk=set())
    assert late["gpu_s_lost"] == pytest.approx(4 * (18.5 - 13 * 1.0), abs=0.1)


def test_a_run_without_a_step_past_the_failure_has_no_figures_yet() -> None:
    rows = report(1, range(1, 11), T0 + 10, 1.0)
    with pytest.raises(ValueError, match="no step past"):
        figures(rows, T0 + 10.5, T0 + 11, ranks=4, replacement=None, from_disk=set())
    with pytest.raises(ValueError, match="before the Xid"):
        figures(rows, T0 + 0.5, T0 + 1, ranks=4, replacement=None, from_disk=set())
