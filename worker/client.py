"""The library a training script of your own uses under runyard (`entrypoint:` in a run spec).

    from worker.client import connect
    session = connect()               # reads what runyard's launcher put in the environment
    start = session.resume.step if session.resume else 0   # load session.resume.path yourself
    ...
    session.report(step, loss, tokens=batch_tokens)        # every step; never blocks
    if step % 100 == 0:
        save(...); session.committed(step, path)           # after the save is complete
    if session.should_stop: ...                            # agree across ranks, save, exit 0
    session.finish(step)                                   # all steps trained

Rank 0 reports to the service (the same HTTP reporter as runyard's trainer, so `run watch`,
goodput and recovery see the script's steps and checkpoints); other ranks' calls are no-ops
except `should_stop`. `should_stop` turns true when the service asks the run to stop
(cancel, preemption, the end of a time-limited segment: seen by rank 0 in its report
replies) or when Slurm's time-limit signal (SIGUSR2, forwarded by the launcher) arrives;
ranks may see it at different steps, so a script all-reduces it before acting, as the
example does. No torch import here: the script chooses its own.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.reporter import FileReporter, HttpReporter, Reporter

# What the launcher (worker/entrypoint.py) sets for the script, besides RANK, WORLD_SIZE,
# LOCAL_RANK, MASTER_ADDR and MASTER_PORT.
ENV_SERVICE_URL = "RUNYARD_SERVICE_URL"  # absent: standalone (no service)
ENV_ATTEMPT_ID = "RUNYARD_ATTEMPT_ID"
ENV_NODE = "RUNYARD_NODE"
ENV_CHECKPOINT_DIR = "RUNYARD_CHECKPOINT_DIR"
ENV_RESUME_STEP = "RUNYARD_RESUME_STEP"  # absent: a fresh start
ENV_RESUME_PATH = "RUNYARD_RESUME_PATH"
ENV_STEPS = "RUNYARD_STEPS"
ENV_REPORT_INTERVAL_S = "RUNYARD_REPORT_INTERVAL_S"
ENV_METRICS_FILE = "RUNYARD_METRICS_FILE"  # standalone: rank 0 appends reports here


@dataclass(frozen=True)
class Resume:
    """The newest checkpoint the script committed in an earlier attempt: load it."""

    step: int
    path: str


class Session:
    """This rank's link to runyard for one attempt."""

    def __init__(self, environ: Mapping[str, str], reporter: Reporter) -> None:
        self.rank = int(environ.get("RANK", "0"))
        self.world_size = int(environ.get("WORLD_SIZE", "1"))
        self.local_rank = int(environ.get("LOCAL_RANK", "0"))
        self.checkpoint_dir = Path(environ.get(ENV_CHECKPOINT_DIR, "checkpoints"))
        self.steps = int(environ.get(ENV_STEPS, "0")) or None
        self.resume = (
            Resume(int(environ[ENV_RESUME_STEP]), environ[ENV_RESUME_PATH])
            if ENV_RESUME_STEP in environ and ENV_RESUME_PATH in environ
            else None
        )
        self._reporter = reporter
        self._time_limit_near = threading.Event()
        self._last_report = time.monotonic()
        self._last_step = self.resume.step if self.resume else 0
        self._last_checkpoint_step = self._last_step
        self._previous_usr2: Any = None
        if threading.current_thread() is threading.main_thread():
            self._previous_usr2 = signal.signal(
                signal.SIGUSR2, lambda *_: self._time_limit_near.set()
            )

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    def report(self, step: int, loss: float, tokens: int) -> None:
        """Step `step` done: its loss, and the tokens it trained on (all ranks together)."""
        now = time.monotonic()
        step_time_s = max((now - self._last_report) / max(step - self._last_step, 1), 1e-9)
        self._last_report, self._last_step = now, step
        self._reporter.metric(step, float(loss), tokens / step_time_s, step_time_s)

    def committed(self, step: int, path: str | Path, num_bytes: int = 0) -> bool:
        """A checkpoint of `step` is completely written at `path`: the next attempt resumes
        from the newest one the service knows of. Call it on rank 0 once every rank's part
        is on disk. True once the service has it (only then delete older ones)."""
        self._last_checkpoint_step = step
        return self._reporter.checkpoint(step, str(Path(path).resolve()), "COMMITTED", num_bytes)

    @property
    def should_stop(self) -> bool:
        """The run must stop: save a checkpoint, call `committed`, exit 0."""
        return self._reporter.cancel_requested or self._time_limit_near.is_set()

    def finish(self, step: int) -> None:
        """Every step is trained (not after a stop: the run is not done then)."""
        self._reporter.finish(step, self._last_checkpoint_step)

    def close(self) -> None:
        """Deliver what is buffered and give SIGUSR2 back to whoever had it."""
        self._reporter.close()
        if self._previous_usr2 is not None:
            signal.signal(signal.SIGUSR2, self._previous_usr2)
            self._previous_usr2 = None

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *_: object) -> None:
        self.close()


def connect(environ: Mapping[str, str] = os.environ) -> Session:
    """The session the launcher prepared; standalone (no service), reports go to
    $RUNYARD_METRICS_FILE on rank 0, or nowhere."""
    reporter: Reporter = Reporter()
    if int(environ.get("RANK", "0")) == 0:
        if ENV_SERVICE_URL in environ:
            reporter = HttpReporter(
                environ[ENV_SERVICE_URL],
                int(environ[ENV_ATTEMPT_ID]),
                node=environ.get(ENV_NODE, ""),
                interval_s=float(environ.get(ENV_REPORT_INTERVAL_S, "2.0")),
            )
        elif ENV_METRICS_FILE in environ:
            reporter = FileReporter(Path(environ[ENV_METRICS_FILE]))
    return Session(environ, reporter)
