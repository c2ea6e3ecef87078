"""The fault hooks' own behaviour, where it is more than firing at a point: the sleeping
faults (slow_step, pace_step) and their durations, and which faults a rank keeps."""

from __future__ import annotations

import time

import pytest
import torch

from worker import faults
from worker.fault_points import NO_FAULTS


def test_pace_step_makes_a_step_last_its_seconds_and_no_longer() -> None:
    spec = "pace_step:3:*@paced=0.2,slow_step:1:1=0.01"
    (pace, slow) = faults.parse(spec)
    assert (pace.name, pace.step, pace.rank, pace.run, pace.seconds) == (
        "pace_step",
        3,
        None,
        "paced",
        0.2,
    )
    points = faults.fault_points(spec, "paced", 1)
    assert isinstance(points, faults.InjectedFaults)
    assert slow.seconds == 0.01 and points.slow_down_s(5, 1) == 0.01
    assert points.pace_rest_s(2, 0, time.monotonic()) == 0.0  # before its step

    started = time.monotonic() - 0.05  # the step computed for 50 ms
    assert 0 < points.pace_rest_s(7, 1, started) <= 0.15  # every rank, every step from 3 on
    points.step_end(7, 1, started, 1)  # sleeps out the rest
    assert time.monotonic() - started >= 0.2
    assert points.pace_rest_s(8, 0, time.monotonic() - 0.5) == 0.0  # already slower
    # Two shares of the batch (a replica group covering a lost group's): twice the floor.
    started = time.monotonic() - 0.25
    assert 0.1 < points.pace_rest_s(9, 0, started, shares=2) <= 0.15
    points.step_end(9, 0, started, 2)
    assert time.monotonic() - started >= 0.4

    other = faults.fault_points(spec, "other", 1)  # only slow_step names every run
    assert isinstance(other, faults.InjectedFaults)
    assert other.pace_rest_s(7, 1, time.monotonic()) == 0.0
    with pytest.raises(ValueError, match="needs =<seconds>"):
        faults.parse("pace_step:1:*")
    for bad in ("slow_step:1=-1", "slow_step:1=nan", "pace_step:1=", "pace_step:1=soon"):
        with pytest.raises(ValueError, match="not a number of seconds"):
            faults.parse(bad)
    with pytest.raises(ValueError, match="take =<seconds>"):
        faults.parse("raise_after_step:30=5")


def test_a_rank_keeps_only_the_faults_of_its_run_and_attempt_and_none_in_production() -> None:
    assert faults.fault_points_from_env("tiny", 1, environ={}) is NO_FAULTS
    assert faults.fault_points_from_env("tiny", 1, environ={"RUNYARD_FAULT": ""}) is NO_FAULTS
    # Faults that name other runs or attempts leave nothing to call: production's no-op.
    spec = "after_step:5@other,raise_after_step:7:*:2@tiny"
    assert faults.fault_points(spec, "tiny", 1) is NO_FAULTS
    kept = faults.fault_points_from_env(
        "tiny", 2, environ={"RUNYARD_FAULT": spec, "RUNYARD_FAULT_SLOW_S": "0.5"}
    )
    assert isinstance(kept, faults.InjectedFaults)
    assert [f.name for f in kept.faults] == ["raise_after_step"] and kept.slow_s == 0.5
    with pytest.raises(ValueError, match="not one of"):  # at start-up, not at the step
        faults.fault_points_from_env("tiny", 1, environ={"RUNYARD_FAULT": "explode:3"})
    # The no-op passes a step's values through untouched.
    loss = torch.ones(())
    assert NO_FAULTS.step_values(5, 0, loss) is loss
