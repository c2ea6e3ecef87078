"""A script's progress read from its output (`progress: {pattern}` in a run spec).

A torchrun script that never imports runyard (torchtitan, Megatron, your own) still prints
its steps. The launcher (worker/entrypoint.py) passes rank 0's output through to the rank's
log unchanged, as it arrives, and searches each line with the spec's pattern: the named
group `step` is the optimizer step, `loss` (optional) its loss. Each new step becomes a
progress report through the same reporter runyard's trainer uses, so `run watch`, goodput
and hang detection (no output, no steps) see the script like any run.

Both stdout and stderr are read: Python's logging writes to stderr, and torchtitan's and
Hugging Face's step lines are log records.
"""

from __future__ import annotations

import math
import os
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO

from contract.entrypoint import ProgressPattern
from worker.reporter import Reporter

# Terminal colour and cursor codes (CSI sequences): torchtitan colours its step lines.
TERMINAL_CODES = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
# A "line" longer than this (a progress bar never ended, binary output) is searched in
# pieces of this size rather than held whole.
MAX_LINE_BYTES = 64 * 1024
READ_BYTES = 64 * 1024
LINE_ENDS = re.compile(rb"[\r\n]")  # \r too: progress bars redraw one line in place


@dataclass(frozen=True)
class StepLine:
    """What one matching line said: the step, and its loss if the line had one."""

    step: int
    loss: float | None


class ProgressParser:
    """Finds the step (and loss) in one line of output, or None."""

    def __init__(self, progress: ProgressPattern) -> None:
        self._regex = progress.compiled()
        self.has_loss = "loss" in self._regex.groupindex

    def parse(self, line: str) -> StepLine | None:
        found = self._regex.search(TERMINAL_CODES.sub("", line))
        if found is None or found.group("step") is None:
            return None
        try:
            step = int(found.group("step").replace(",", "").replace("_", ""))
        except ValueError:
            return None  # the pattern matched something else than digits
        loss = found.group("loss") if self.has_loss else None
        try:
            return StepLine(step, float(loss) if loss is not None else None)
        except ValueError:
            return StepLine(step, None)


class StepReports:
    """Turns the steps rank 0 printed into metric reports: each step once, in order.

    A step at or below the last one reported (a line printed twice, a resumed script
    announcing the step it loaded) is not reported again. A line without a loss reports
    the last loss seen (0.0 before any: the service's metric rows need one); a non-finite
    loss has no JSON form, so that step is not reported (as runyard's trainer does). The
    step time is the wall time since the last reported step, per step between them.
    """

    def __init__(self, reporter: Reporter, after_step: int, clock: Callable[[], float]) -> None:
        self._reporter, self._clock = reporter, clock
        self._lock = threading.Lock()  # stdout's and stderr's readers both report
        self.last_step = after_step
        self._last_at = clock()
        self._last_loss = 0.0
        self._warned = False

    def see(self, found: StepLine) -> None:
        with self._lock:
            if found.step <= self.last_step:
                return
            loss = self._last_loss if found.loss is None else found.loss
            if not math.isfinite(loss):
                if not self._warned:
                    self._warned = True
                    print(f"[runyard] step {found.step}: loss {loss} not reported", file=sys.stderr)
                return
            now = self._clock()
            step_time_s = max(now - self._last_at, 0.0) / (found.step - self.last_step)
            self.last_step, self._last_at, self._last_loss = found.step, now, loss
            # A script prints no token counts: tokens/s (and with it MFU) stays unknown.
            self._reporter.metric(found.step, loss, None, step_time_s)  # type: ignore[arg-type]


def pump(source: int, sink: IO[bytes], on_line: Callable[[str], None]) -> None:
    """Copy everything from the file descriptor `source` to `sink` as it arrives (the rank's
    log keeps the script's output byte for byte, unbuffered), and hand each complete line to
    `on_line`. Returns at end of file, with the last unfinished line handed over too."""
    pending = b""
    while chunk := os.read(source, READ_BYTES):
        try:
            sink.write(chunk)
            sink.flush()
        except (OSError, ValueError):
            pass  # the log went away: keep reading, or the script blocks on a full pipe
        pending += chunk
        *lines, pending = LINE_ENDS.split(pending)
        if len(pending) > MAX_LINE_BYTES:
            lines, pending = [*lines, pending], b""
        for line in lines:
            if line:
                on_line(line.decode("utf-8", errors="replace"))
    if pending:
        on_line(pending.decode("utf-8", errors="replace"))


class OutputReader:
    """Reads one of the script's output pipes on a thread of its own, so a full pipe never
    blocks the script, and reports the steps found in it."""

    def __init__(
        self, source: IO[bytes], sink: IO[bytes], parser: ProgressParser, steps: StepReports
    ) -> None:
        self._source = source
        self._failed = False

        def on_line(line: str) -> None:
            try:
                found = parser.parse(line)
                if found is not None:
                    steps.see(found)
            except Exception as exc:  # never stop copying: a full pipe would block the script
                if not self._failed:
                    self._failed = True
                    print(f"[runyard] reading progress failed: {exc!r}", file=sys.stderr)

        self._thread = threading.Thread(
            target=pump, args=(source.fileno(), sink, on_line), name="runyard-output", daemon=True
        )
        self._thread.start()

    def join(self, timeout_s: float) -> None:
        """Wait for the end of the output: the script has exited, but a process it started
        may hold the pipe open a while longer; past `timeout_s` it is left to itself."""
        self._thread.join(timeout_s)
