"""Rank 0's reports to the service's /v1/worker/attempts/{id}/... endpoints.

Metrics go into an in-memory buffer that a background thread flushes in order every
`interval_s`; while the service is down the buffer grows (up to MAX_BUFFERED, then the
oldest go) and the thread backs off. Checkpoint registrations and the final `finish` matter
more, so they are sent synchronously with bounded retries, then logged and given up. The
replies carry what the service wants of the run: stop (cancel, preemption, the end of a
segment) and the checkpoint interval.
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
from collections import deque
from typing import Any

from .errors import RequestError
from .protocol import MAX_REPORT_BACKOFF_S
from .reporting import Reporter
from .transport import request, request_headers, with_retries

MAX_BUFFERED = 100_000  # ~10 MB of metric rows: days of steps at one row per step
MAX_BATCH = 1_000  # rows per progress POST
CHECKPOINT_RETRY_S = 60.0  # then log and go on: losing a registration beats losing training
WRITING_RETRY_S = 3.0  # a WRITING registration is best effort
FIRST_RETRY_WAIT_S = 0.5  # doubling up to MAX_RETRY_WAIT_S between tries
MAX_RETRY_WAIT_S = 10.0
ERROR_REPORT_RETRY_S = 10.0  # a failing rank should not linger long


def warn(message: str) -> None:
    """One line on stderr: the reporter never raises into training."""
    print(f"[reporter] {message}", file=sys.stderr, flush=True)


def attempt_url(service_url: str, attempt_id: int) -> str:
    """The root of one attempt's worker endpoints."""
    return f"{service_url.rstrip('/')}/v1/worker/attempts/{attempt_id}"


def error_body(
    rank: int, node: str, kind: str, message: str, step: int | None, **extra: Any
) -> dict[str, Any]:
    """The body of POST .../errors (service/worker_protocol/schemas.py ErrorReport), with the
    service's length limits applied."""
    body: dict[str, Any] = {
        "rank": rank,
        "node": node[:64],
        "kind": kind,
        "message": message[:4000],
    }
    if step is not None:
        body["step"] = step
    body.update(extra)
    return body


def post_error(
    service_url: str,
    attempt_id: int,
    *,
    rank: int,
    node: str,
    kind: str,
    message: str,
    step: int | None = None,
) -> None:
    """Tell the service why this rank is about to exit (any rank; bounded: it is dying).
    `step`: the step it failed at, if known (the service compares repeat failures by it)."""
    url = f"{attempt_url(service_url, attempt_id)}/errors"
    body = error_body(rank, node, kind, message, step)
    headers = request_headers()
    try:
        with_retries(
            lambda: request("POST", url, body, headers=headers, timeout_s=5.0),
            stop_after_s=ERROR_REPORT_RETRY_S,
            first_wait_s=FIRST_RETRY_WAIT_S,
            max_wait_s=2.0,
        )
    except RequestError as exc:
        warn(f"POST {url} {kind} not delivered: {exc}")


class HttpReporter(Reporter):
    """Rank 0's reporter to the service's /v1/worker/attempts/{id}/... endpoints.

    `token`: the bearer token; None reads $RUNYARD_TOKEN. Its bounds are read at each use
    from the properties below (this module's constants), so a host program can set its own.
    """

    def __init__(
        self,
        service_url: str,
        attempt_id: int,
        *,
        node: str,
        interval_s: float,
        rank: int = 0,
        token: str | None = None,
    ) -> None:
        self.node, self.rank, self.interval_s = node, rank, interval_s
        self._base_url = attempt_url(service_url, attempt_id)
        self._headers = request_headers(token)
        self._buffer: deque[tuple[int, dict[str, Any]]] = deque()  # (sequence number, row)
        self._held_out: list[dict[str, Any]] = []  # held-out losses, sent with the next rows
        # The newest straggler figures and clean SDC comparison: only the latest matters.
        self._latest: dict[str, Any] = {}
        self._numbers = itertools.count()
        self._lock = threading.Lock()  # guards the buffer
        self._send_lock = threading.Lock()  # one progress POST in flight at a time, in order
        self._stop = threading.Event()
        self._failures = 0
        self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="runyard-reporter", daemon=True)
        self._thread.start()

    @property
    def max_buffered(self) -> int:
        """Metric rows held while the service is unreachable; past it the oldest go."""
        return MAX_BUFFERED

    @property
    def checkpoint_retry_s(self) -> float:
        """How long a COMMITTED registration (with its steps' rows) and `finish` are tried."""
        return CHECKPOINT_RETRY_S

    @property
    def first_retry_wait_s(self) -> float:
        """The first wait between tries of a registration; it doubles from there."""
        return FIRST_RETRY_WAIT_S

    def metric(
        self,
        step: int,
        loss: float,
        tokens_per_s: float,
        step_time_s: float,
        lr: float | None = None,
    ) -> None:
        row = {"step": step, "loss": loss, "tokens_per_s": tokens_per_s, "step_time_s": step_time_s}
        if lr is not None:
            row["lr"] = lr
        with self._lock:
            if len(self._buffer) >= self.max_buffered:
                self._buffer.popleft()
                self.dropped += 1
                if self.dropped == 1:
                    warn(
                        f"service unreachable for {self.max_buffered} steps: "
                        "dropping the oldest metrics"
                    )
            self._buffer.append((next(self._numbers), row))

    def validation(self, step: int, loss: float) -> None:
        with self._lock:
            self._held_out.append({"step": step, "loss": loss})

    def node_update_s(self, step: int, update_s: dict[str, float]) -> None:
        with self._lock:
            self._latest["node_update_s"] = {"step": step, "update_s": update_s}

    def sdc_clean(self, step: int) -> None:
        with self._lock:
            self._latest["sdc_clean_step"] = step

    def sdc(
        self,
        step: int,
        nodes: list[str],
        clean_step: int | None,
        message: str,
        outvoted: bool = False,
    ) -> None:
        # Read when the job ends (service/recovery/sdc.py) and drains `nodes` at once.
        self._drain(timeout_s=WRITING_RETRY_S)
        body = error_body(
            self.rank,
            self.node,
            "worker:sdc",
            message,
            step,
            nodes=nodes,
            clean_step=clean_step,
            outvoted=outvoted,
        )
        self._post_with_retry("/errors", body, self.checkpoint_retry_s)

    def pending(self) -> int:
        with self._lock:
            return len(self._buffer) + len(self._held_out)

    def _run(self) -> None:
        while True:
            wait_s = min(self.interval_s * 2**self._failures, MAX_REPORT_BACKOFF_S)
            if self._stop.wait(wait_s):
                return
            try:
                self.flush_once()
            except Exception as exc:  # a bug here must not silence every later report
                warn(f"progress flush crashed, will retry: {exc!r}")

    def flush_once(self) -> bool:
        """POST the oldest buffered rows; True when the buffer is (now) empty."""
        with self._send_lock:
            with self._lock:
                batch = list(itertools.islice(self._buffer, MAX_BATCH))
                held_out = list(self._held_out)
                latest = dict(self._latest)
            if not batch and not held_out:
                return True
            body = {
                "rank": self.rank,
                "node": self.node,
                "metrics": [row for _, row in batch],
                "validation": held_out,
                **latest,
            }
            steps = f"{batch[0][1]['step']}..{batch[-1][1]['step']}" if batch else "none"
            try:
                reply = request("POST", f"{self._base_url}/progress", body, headers=self._headers)
            except RequestError as exc:
                if exc.retryable:
                    if self._failures == 0:
                        warn(f"progress report failed, will retry: {exc}")
                    self._failures = min(self._failures + 1, 10)
                    return False
                # The service refused these rows (4xx): resending cannot succeed, and would
                # hold back every later row. Drop them, loudly.
                warn(f"progress rows {steps} refused: {exc}")
            except ValueError as exc:  # NaN or infinity: no JSON form, now or later
                warn(f"progress rows {steps} cannot be sent: {exc}")
            else:
                if self._failures:
                    warn("progress reports delivered again")
                self._failures = 0
                self._read_run_state(reply)
            with self._lock:  # drop what was sent; rows dropped for space meanwhile are gone
                del self._held_out[: len(held_out)]
                for key, value in latest.items():
                    if self._latest.get(key) == value:
                        del self._latest[key]
                last_sent = batch[-1][0] if batch else -1
                while self._buffer and self._buffer[0][0] <= last_sent:
                    self._buffer.popleft()
                return not self._buffer and not self._held_out

    def _read_run_state(self, content: bytes) -> None:
        try:
            reply = json.loads(content)
        except ValueError:
            return
        if not isinstance(reply, dict):
            return
        # Cancelled, preempted or at the end of a time-limited segment: in every case the
        # ranks finish the step, checkpoint and exit 0 (the service knows which it was).
        run_state = reply.get("run_state")
        self.cancel_requested = run_state == "CANCELLING" or bool(reply.get("stop_requested"))
        every = reply.get("checkpoint_every")
        self.checkpoint_every = every if isinstance(every, int) and every > 0 else None

    def _post_with_retry(self, path: str, body: dict[str, Any], stop_after_s: float) -> bool:
        url = f"{self._base_url}{path}"
        try:
            with_retries(
                lambda: request("POST", url, body, headers=self._headers),
                stop_after_s=stop_after_s,
                first_wait_s=self.first_retry_wait_s,
                max_wait_s=MAX_RETRY_WAIT_S,
            )
        except RequestError as exc:
            warn(f"POST {path} {body} not delivered, giving up: {exc}")
            return False
        return True

    def checkpoint(
        self,
        step: int,
        path: str,
        state: str,
        num_bytes: int = 0,
        write_s: float = 0.0,
        detail: str = "",
        stall_s: float | None = None,
    ) -> bool:
        body: dict[str, Any] = {
            "step": step,
            "path": path,
            "state": state,
            "num_bytes": num_bytes,
            "write_s": write_s,
        }
        if detail:
            body["detail"] = detail[:4000]
        if stall_s is not None:
            body["stall_s"] = stall_s
        # WRITING is informational: a service that is down must not stall training for it.
        # COMMITTED is what resumes rely on: worth waiting for, within a bound.
        stop_after_s = WRITING_RETRY_S if state == "WRITING" else self.checkpoint_retry_s
        if state == "COMMITTED":
            # No step without its figures: the rows of the steps this checkpoint holds reach
            # the service before the commit does. Once the service knows of the commit, a
            # crash resumes from it, and those steps are never trained or reported again.
            deadline = time.monotonic() + stop_after_s
            self._drain(timeout_s=stop_after_s)
            stop_after_s = max(deadline - time.monotonic(), self.first_retry_wait_s)
        return self._post_with_retry("/checkpoints", body, stop_after_s)

    def anomaly(self, step: int, kind: str, figure: str, message: str) -> None:
        # The service's errors endpoint, kind worker:anomaly: read when the job ends
        # (service/runs/rollback.py), so it is delivered, within a bound, before the exit.
        self._drain(timeout_s=WRITING_RETRY_S)  # the timeline shows the steps up to it
        body = error_body(
            self.rank, self.node, "worker:anomaly", f"{kind} {figure}: {message}", step
        )
        self._post_with_retry("/errors", body, self.checkpoint_retry_s)

    def _drain(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.flush_once() and time.monotonic() < deadline:
            time.sleep(0.5)

    def finish(self, final_step: int, final_checkpoint_step: int) -> None:
        # The service sees every step before "finished".
        self._drain(timeout_s=self.checkpoint_retry_s)
        body = {"final_step": final_step, "final_checkpoint_step": final_checkpoint_step}
        self._post_with_retry("/finish", body, self.checkpoint_retry_s)

    def close(self, drain_timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._thread.join()
        self._drain(timeout_s=drain_timeout_s)
        if self.pending():
            warn(f"{self.pending()} metric rows never delivered")
