"""A training script's link to runyard for one attempt: `connect()` and its Session.

Rank 0 reports to the service (the same HttpReporter as runyard's trainer, so `run watch`,
goodput and recovery see the script's steps and checkpoints); other ranks' calls are no-ops
except `should_stop`. `should_stop` turns true when the service asks the run to stop
(cancel, preemption, the end of a time-limited segment: seen by rank 0 in its report
replies) or when Slurm's time-limit signal (SIGUSR2, forwarded by the launcher) arrives;
ranks may see it at different steps, so a script all-reduces it before acting. No torch
import here: the script chooses its own.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import ProtocolMismatchError, RequestError, ServiceError
from .http_reporter import FIRST_RETRY_WAIT_S, HttpReporter, warn
from .protocol import PROTOCOL_VERSION, UNVERSIONED_PROTOCOL
from .reporting import FileReporter, Reporter
from .transport import ENV_TOKEN, request_headers, request_json, with_retries

# What the launcher (runyard's worker/entrypoint.py) sets for the script, besides RANK,
# WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT (and RUNYARD_TOKEN, transport.py).
ENV_SERVICE_URL = "RUNYARD_SERVICE_URL"  # absent: standalone (no service)
ENV_ATTEMPT_ID = "RUNYARD_ATTEMPT_ID"
ENV_NODE = "RUNYARD_NODE"
ENV_CHECKPOINT_DIR = "RUNYARD_CHECKPOINT_DIR"
ENV_RESUME_STEP = "RUNYARD_RESUME_STEP"  # absent: a fresh start
ENV_RESUME_PATH = "RUNYARD_RESUME_PATH"
ENV_STEPS = "RUNYARD_STEPS"
ENV_REPORT_INTERVAL_S = "RUNYARD_REPORT_INTERVAL_S"
ENV_METRICS_FILE = "RUNYARD_METRICS_FILE"  # standalone: rank 0 appends reports here

# How long connect() keeps asking an unreachable service which protocol it speaks. The
# launcher fetched the attempt's config from it moments before, so a longer silence is an
# outage: the script trains on, and its reports wait in the reporter's buffer.
PROTOCOL_CHECK_S = 30.0


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
        self._warned_non_finite = False
        self._previous_usr2: Any = None
        if threading.current_thread() is threading.main_thread():
            self._previous_usr2 = signal.signal(
                signal.SIGUSR2, lambda *_: self._time_limit_near.set()
            )

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    def report(self, step: int, loss: float, tokens: int, lr: float | None = None) -> None:
        """Step `step` done: its loss, the tokens it trained on (all ranks together) and the
        learning rate it used. Never blocks. A NaN or infinite loss has no JSON form: the
        step gets no row (warned once), and later steps are reported as usual."""
        now = time.monotonic()
        step_time_s = max((now - self._last_report) / max(step - self._last_step, 1), 1e-9)
        self._last_report, self._last_step = now, step
        if not math.isfinite(loss):
            if not self._warned_non_finite:
                warn(f"loss {loss} at step {step}: non-finite losses are not reported")
                self._warned_non_finite = True
            return
        self._reporter.metric(step, float(loss), tokens / step_time_s, step_time_s, lr=lr)

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


def check_protocol(service_url: str, token: str | None = None) -> None:
    """Raise ProtocolMismatchError unless the service speaks PROTOCOL_VERSION.

    Asks GET /v1/worker/protocol (`{"oldest": N, "newest": M}`); a service without that
    endpoint predates it and speaks UNVERSIONED_PROTOCOL. A service that stays unreachable
    for PROTOCOL_CHECK_S, or answers something else, is not refused: the script trains on
    and its reports say more (a service that refuses them names both versions)."""
    url = f"{service_url.rstrip('/')}/v1/worker/protocol"
    headers = request_headers(token)
    try:
        spoken = with_retries(
            lambda: request_json("GET", url, headers=headers),
            stop_after_s=PROTOCOL_CHECK_S,
            first_wait_s=FIRST_RETRY_WAIT_S,
            max_wait_s=5.0,
        )
        oldest, newest = int(spoken["oldest"]), int(spoken["newest"])
    except ServiceError as exc:
        if exc.status != 404:
            warn(f"could not learn the service's protocol, reporting anyway: {exc}")
            return
        oldest = newest = UNVERSIONED_PROTOCOL
    except RequestError as exc:
        warn(f"could not learn the service's protocol, reporting anyway: {exc}")
        return
    except (ValueError, TypeError, KeyError) as exc:
        warn(f"GET {url}: an answer without a protocol range ({exc!r}), reporting anyway")
        return
    if not oldest <= PROTOCOL_VERSION <= newest:
        raise ProtocolMismatchError(PROTOCOL_VERSION, oldest, newest, service_url)


def connect(environ: Mapping[str, str] = os.environ) -> Session:
    """The session the launcher prepared; standalone (no service), reports go to
    $RUNYARD_METRICS_FILE on rank 0, or nowhere. With a service, rank 0 first checks that
    it speaks this client's protocol: ProtocolMismatchError if it does not."""
    reporter: Reporter = Reporter()
    if int(environ.get("RANK", "0")) == 0:
        if ENV_SERVICE_URL in environ:
            token = environ.get(ENV_TOKEN, "")
            check_protocol(environ[ENV_SERVICE_URL], token)
            reporter = HttpReporter(
                environ[ENV_SERVICE_URL],
                int(environ[ENV_ATTEMPT_ID]),
                node=environ.get(ENV_NODE, ""),
                interval_s=float(environ.get(ENV_REPORT_INTERVAL_S, "2.0")),
                token=token,
            )
        elif ENV_METRICS_FILE in environ:
            reporter = FileReporter(Path(environ[ENV_METRICS_FILE]))
    return Session(environ, reporter)
