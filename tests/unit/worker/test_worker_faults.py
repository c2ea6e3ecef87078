"""The fault hooks' own behaviour, where it is more than firing at a point: the sleeping
faults (slow_step, pace_step) and their durations."""

from __future__ import annotations

import os
import time

import pytest

from worker import faults


def test_pace_step_makes_a_step_last_its_seconds_and_no_longer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(faults, "_context", {"run": "paced", "attempt": 1})
    monkeypatch.setenv("RUNYARD_FAULT", "pace_step:3:*@paced=0.2,slow_step:1:1=0.01")
    (pace, slow) = faults.parse(os.environ["RUNYARD_FAULT"])
    assert (pace.name, pace.step, pace.rank, pace.run, pace.seconds) == (
        "pace_step",
        3,
        None,
        "paced",
        0.2,
    )
    assert slow.seconds == 0.01 and faults.slow_down(5, 1) == 0.01
    assert faults.pace(2, 0, time.monotonic()) == 0.0  # before its step

    started = time.monotonic() - 0.05  # the step computed for 50 ms
    slept = faults.pace(7, 1, started)  # every rank, every step from 3 on
    assert 0 < slept <= 0.15 and time.monotonic() - started >= 0.2
    assert faults.pace(8, 0, time.monotonic() - 0.5) == 0.0  # already slower than the pace
    # Two shares of the batch (a replica group covering a lost group's): twice the floor.
    started = time.monotonic() - 0.25
    assert 0.1 < faults.pace(9, 0, started, shares=2) <= 0.15
    assert time.monotonic() - started >= 0.4

    monkeypatch.setattr(faults, "_context", {"run": "other", "attempt": 1})
    assert faults.pace(7, 1, time.monotonic()) == 0.0
    with pytest.raises(ValueError, match="needs =<seconds>"):
        faults.parse("pace_step:1:*")
    for bad in ("slow_step:1=-1", "slow_step:1=nan", "pace_step:1=", "pace_step:1=soon"):
        with pytest.raises(ValueError, match="not a number of seconds"):
            faults.parse(bad)
    with pytest.raises(ValueError, match="take =<seconds>"):
        faults.parse("raise_after_step:30=5")
