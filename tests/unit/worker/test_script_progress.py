"""A script's steps read from its output (`progress: {pattern}`): the pattern finds the step
and loss in the lines a script prints (plain, torchtitan's, coloured or inside a log
record), ignores every other line, and each new step is reported once, in order."""

from __future__ import annotations

import io
import json
import math
import os
from pathlib import Path

import pytest

from contract.entrypoint import ProgressPattern
from worker.reporter import FileReporter
from worker.script_progress import ProgressParser, StepLine, StepReports, pump

PLAIN = ProgressPattern(pattern=r"step (?P<step>\d+) loss (?P<loss>\S+)")
TORCHTITAN = ProgressPattern(pattern=r"step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>[-+.\deE]+)")
STEP_ONLY = ProgressPattern(pattern=r"iteration (?P<step>[\d,]+)/")


def test_a_plain_step_line() -> None:
    parser = ProgressParser(PLAIN)
    assert parser.parse("step 12 loss 3.25") == StepLine(12, 3.25)
    assert parser.parse("[rank0] step 7 loss 1e-3 lr 3e-4") == StepLine(7, 0.001)


@pytest.mark.parametrize(
    "line",
    [
        "step: 10  loss:  7.8",
        # As torchtitan's logger prints it, colours and all.
        "[titan] 2025-03-01 12:00:00,123 - root - INFO - \x1b[31mstep: 10  \x1b[32mloss:  7.8000"
        "  \x1b[33mmemory: 12.34GiB(15.61%)  \x1b[34mtps: 1,234  \x1b[35mmfu: 40.12%\x1b[39m",
    ],
)
def test_torchtitans_step_line(line: str) -> None:
    assert ProgressParser(TORCHTITAN).parse(line) == StepLine(10, 7.8)


@pytest.mark.parametrize(
    "line",
    [
        "Building model with 8 layers",
        "step: warmup  loss: n/a",
        "[titan] Saving checkpoint at step 10",
        "",
    ],
)
def test_other_lines_are_ignored(line: str) -> None:
    assert ProgressParser(TORCHTITAN).parse(line) is None
    assert ProgressParser(PLAIN).parse(line) is None


def test_a_pattern_without_a_loss_still_gives_the_step() -> None:
    """Megatron-style `iteration 1,200/...`: digits with separators are a step too."""
    parser = ProgressParser(STEP_ONLY)
    assert parser.parse(" iteration 1,200/ 5000 | elapsed time 1.2") == StepLine(1200, None)
    assert ProgressParser(PLAIN).parse("step 3 loss nan?") == StepLine(3, None)


def test_each_new_step_is_reported_once_in_order(tmp_path: Path) -> None:
    """A resumed script announcing the step it loaded, a line printed twice, a step without
    a loss (the last loss carried) and a non-finite loss (no JSON form: not reported)."""
    metrics = tmp_path / "metrics.jsonl"
    clock = iter([100.0, 101.0, 103.0, 104.0])
    steps = StepReports(FileReporter(metrics), after_step=20, clock=lambda: next(clock))
    for found in [StepLine(20, 9.0), StepLine(21, 4.0), StepLine(21, 4.0), StepLine(23, None),
                  StepLine(24, math.nan), StepLine(25, 3.5)]:  # fmt: skip
        steps.see(found)
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert [(r["step"], r["loss"]) for r in rows] == [(21, 4.0), (23, 4.0), (25, 3.5)]
    assert [r["step_time_s"] for r in rows] == [1.0, 1.0, 0.5]  # per step since the last
    assert all(r["tokens_per_s"] is None for r in rows)  # a script's output says no tokens
    assert steps.last_step == 25


def test_output_goes_through_unchanged_and_lines_end_at_either_break() -> None:
    """What reaches the rank's log is the script's bytes; progress bars that redraw with
    \\r end a line for the parser, and a last line without a break is read at the end."""
    read, write = os.pipe()
    data = b"step 1 loss 2.0\nbar 10%\rbar 20%\r\xffstep 2 loss 1.5"
    os.write(write, data)
    os.close(write)
    log, lines = io.BytesIO(), []
    pump(read, log, lines.append)
    os.close(read)
    assert log.getvalue() == data
    assert lines == ["step 1 loss 2.0", "bar 10%", "bar 20%", "\ufffdstep 2 loss 1.5"]
