"""Reports from rank 0 to the service, without ever stalling or killing training.

Metrics go into an in-memory buffer that a background thread flushes in order every
`report_interval_s`; while the service is down the buffer grows (up to MAX_BUFFERED, then
the oldest go) and the thread backs off. Checkpoint registrations and the final `finish`
matter more, so they are sent synchronously with bounded retries, then logged and given up.
No torch here: entry.py imports this before it needs torch.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import httpx
import pydantic
from tenacity import (
    Retrying,
    retry_if_exception,
    stop_after_delay,
    wait_exponential,
)

from contract import MAX_REPORT_BACKOFF_S, REPORT_REQUEST_TIMEOUT_S, WorkerRunConfig
from worker.errors import DoNotRetryError

MAX_BUFFERED = 100_000  # ~10 MB of metric rows: days of steps at one row per step
MAX_BATCH = 1_000  # rows per progress POST
CHECKPOINT_RETRY_S = 60.0  # then log and go on: losing a registration beats losing training
WRITING_RETRY_S = 3.0  # a WRITING registration is best effort
FIRST_RETRY_WAIT_S = 0.5  # doubling up to 10 s between tries
ERROR_REPORT_RETRY_S = 10.0  # a failing rank should not linger long


def _auth_headers() -> dict[str, str]:
    token = os.environ.get("RUNYARD_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


def _is_retryable(exc: BaseException) -> bool:
    """Network trouble, 5xx and 429 are worth another try; other 4xx are the service's answer."""
    if isinstance(exc, httpx.HTTPStatusError):
        return exc.response.status_code >= 500 or exc.response.status_code == 429
    return isinstance(exc, httpx.TransportError)


def _warn(message: str) -> None:
    print(f"[reporter] {message}", file=sys.stderr, flush=True)


def fetch_config(service_url: str, attempt_id: int, timeout_s: float = 60.0) -> WorkerRunConfig:
    """GET this attempt's resolved config, retrying for up to `timeout_s` while the service
    is unreachable. A 4xx answer or an invalid body is final: DoNotRetryError."""
    url = f"{service_url.rstrip('/')}/v1/worker/attempts/{attempt_id}/config"
    retrying = Retrying(
        retry=retry_if_exception(_is_retryable),
        stop=stop_after_delay(timeout_s),
        wait=wait_exponential(multiplier=FIRST_RETRY_WAIT_S, max=10.0),
        reraise=True,
    )
    try:
        for attempt in retrying:
            with attempt:
                response = httpx.get(url, headers=_auth_headers(), timeout=REPORT_REQUEST_TIMEOUT_S)
                response.raise_for_status()
    except httpx.HTTPStatusError as exc:
        if _is_retryable(exc):
            raise
        raise DoNotRetryError(
            f"GET {url}: {exc.response.status_code} {exc.response.text[:200]}"
        ) from exc
    try:
        return WorkerRunConfig.model_validate(response.json())
    except (pydantic.ValidationError, json.JSONDecodeError) as exc:
        raise DoNotRetryError(f"invalid config from {url}: {exc}") from exc


def error_body(
    rank: int, node: str, kind: str, message: str, step: int | None, **extra: Any
) -> dict[str, Any]:
    """The body of POST .../errors (service/workers/schemas.py ErrorReport), with the
    service's length limits applied."""
    body: dict[str, Any] = {
        "rank": rank,
        "node": node[:64],
        "kind": kind,
        "message": message[:4000],
    }
    if step is not None:
        body["step"] = step
    return body | extra


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
    url = f"{service_url.rstrip('/')}/v1/worker/attempts/{attempt_id}/errors"
    body = error_body(rank, node, kind, message, step)
    retrying = Retrying(
        retry=retry_if_exception(_is_retryable),
        stop=stop_after_delay(ERROR_REPORT_RETRY_S),
        wait=wait_exponential(multiplier=FIRST_RETRY_WAIT_S, max=2.0),
        reraise=True,
    )
    try:
        for attempt in retrying:
            with attempt:
                response = httpx.post(url, json=body, headers=_auth_headers(), timeout=5.0)
                response.raise_for_status()
    except httpx.HTTPError as exc:
        _warn(f"POST {url} {kind} not delivered: {exc!r}")


class Reporter:
    """The no-op reporter: standalone runs and ranks other than 0. Subclasses send."""

    cancel_requested: bool = False  # the service asked this run to stop
    # Steps between checkpoints as the service re-derives them from the cluster's failures
    # (service/plans/live_interval.py); None: keep the config's.
    checkpoint_every: int | None = None

    def metric(
        self,
        step: int,
        loss: float,
        tokens_per_s: float,
        step_time_s: float,
        lr: float | None = None,
    ) -> None:
        """Record one optimizer step and the learning rate it used (never blocks)."""

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
        """Register a checkpoint as WRITING or COMMITTED, or report it CORRUPT with `detail`
        (blocks, bounded). True once the service has it: only then may older checkpoints be
        pruned, because the service resumes from the newest commit *it* knows of. `stall_s`,
        with COMMITTED: what the save cost training in all, its blocking time plus its
        overlapped steps' excess (worker/checkpoint_cost.py)."""
        return True

    def finish(self, final_step: int, final_checkpoint_step: int) -> None:
        """Tell the service the run trained all its steps (blocks, bounded)."""

    def validation(self, step: int, loss: float) -> None:
        """Record the held-out loss at `step` (never blocks)."""

    def anomaly(self, step: int, kind: str, figure: str, message: str) -> None:
        """Report a non-finite or spiking loss or gradient norm at `step` (blocks, bounded):
        the attempt ends next, and the service rolls the run back past it."""

    def node_update_s(self, step: int, update_s: dict[str, float]) -> None:
        """Each node's slowest rank's mean update time over the window ending at `step`
        (worker/stragglers.py); sent with the next progress report (never blocks)."""

    def sdc_clean(self, step: int) -> None:
        """Data-parallel replicas' parameters matched after `step` (worker/sdc.py); sent
        with the next progress report (never blocks)."""

    def sdc(
        self,
        step: int,
        nodes: list[str],
        clean_step: int | None,
        message: str,
        outvoted: bool = False,
    ) -> None:
        """Replicas disagreed at `step`; `nodes` hold the odd ones out (blocks, bounded):
        the attempt ends next, the service drains them and rolls back to before
        `clean_step`, the last comparison that passed. `outvoted`: a strict majority of
        replica groups holds the right copy and trains on (only this group is replaced)."""

    def close(self, drain_timeout_s: float = 10.0) -> None:
        """Deliver what is buffered (for at most `drain_timeout_s`) and stop."""


class FileReporter(Reporter):
    """Appends every report as a JSON line: the standalone mode's record, and tests' oracle."""

    def __init__(self, path: Path) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)

    def _append(self, kind: str, **fields: Any) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps({"kind": kind, **fields}) + "\n")

    def metric(
        self,
        step: int,
        loss: float,
        tokens_per_s: float,
        step_time_s: float,
        lr: float | None = None,
    ) -> None:
        self._append(
            "metric",
            step=step,
            loss=loss,
            tokens_per_s=tokens_per_s,
            step_time_s=step_time_s,
            lr=lr,
        )

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
        self._append(
            "checkpoint",
            step=step,
            path=path,
            state=state,
            num_bytes=num_bytes,
            write_s=write_s,
            stall_s=stall_s,
        )
        return True

    def finish(self, final_step: int, final_checkpoint_step: int) -> None:
        self._append("finish", final_step=final_step, final_checkpoint_step=final_checkpoint_step)

    def validation(self, step: int, loss: float) -> None:
        self._append("validation", step=step, loss=loss)

    def anomaly(self, step: int, kind: str, figure: str, message: str) -> None:
        self._append("anomaly", step=step, anomaly=kind, figure=figure, message=message)

    def node_update_s(self, step: int, update_s: dict[str, float]) -> None:
        self._append("node_update_s", step=step, update_s=update_s)

    def sdc_clean(self, step: int) -> None:
        self._append("sdc_clean", step=step)

    def sdc(
        self,
        step: int,
        nodes: list[str],
        clean_step: int | None,
        message: str,
        outvoted: bool = False,
    ) -> None:
        self._append(
            "sdc", step=step, nodes=nodes, clean_step=clean_step, message=message, outvoted=outvoted
        )


class HttpReporter(Reporter):
    """Rank 0's reporter to the service's /v1/worker/attempts/{id}/... endpoints."""

    def __init__(
        self, service_url: str, attempt_id: int, *, node: str, interval_s: float, rank: int = 0
    ) -> None:
        self.node, self.rank, self.interval_s = node, rank, interval_s
        self._client = httpx.Client(
            base_url=f"{service_url.rstrip('/')}/v1/worker/attempts/{attempt_id}",
            headers=_auth_headers(),
            timeout=REPORT_REQUEST_TIMEOUT_S,
        )
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
            if len(self._buffer) >= MAX_BUFFERED:
                self._buffer.popleft()
                self.dropped += 1
                if self.dropped == 1:
                    _warn(
                        f"service unreachable for {MAX_BUFFERED} steps: dropping the oldest metrics"
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
        # Read when the job ends (service/runs/sdc.py) and drains `nodes` at once.
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
        self._post_with_retry("/errors", body)

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
                _warn(f"progress flush crashed, will retry: {exc!r}")

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
            try:
                response = self._client.post("/progress", json=body)
                response.raise_for_status()
            except httpx.HTTPError as exc:
                if _is_retryable(exc):
                    if self._failures == 0:
                        _warn(f"progress report failed, will retry: {exc!r}")
                    self._failures = min(self._failures + 1, 10)
                    return False
                # The service refused these rows (4xx): resending cannot succeed, and would
                # hold back every later row. Drop them, loudly.
                steps = f"{batch[0][1]['step']}..{batch[-1][1]['step']}" if batch else "none"
                _warn(f"progress rows {steps} refused: {exc!r}")
            else:
                if self._failures:
                    _warn("progress reports delivered again")
                self._failures = 0
                self._read_run_state(response)
            with self._lock:  # drop what was sent; rows dropped for space meanwhile are gone
                del self._held_out[: len(held_out)]
                for key, value in latest.items():
                    if self._latest.get(key) == value:
                        del self._latest[key]
                last_sent = batch[-1][0] if batch else -1
                while self._buffer and self._buffer[0][0] <= last_sent:
                    self._buffer.popleft()
                return not self._buffer and not self._held_out

    def _read_run_state(self, response: httpx.Response) -> None:
        try:
            body = response.json()
            run_state = body.get("run_state")
        except (ValueError, AttributeError):
            return
        # Cancelled, preempted or at the end of a time-limited segment: in every case the
        # ranks finish the step, checkpoint and exit 0 (the service knows which it was).
        self.cancel_requested = run_state == "CANCELLING" or bool(body.get("stop_requested"))
        every = body.get("checkpoint_every")
        self.checkpoint_every = every if isinstance(every, int) and every > 0 else None

    def _post_with_retry(
        self, path: str, body: dict[str, Any], stop_after_s: float = CHECKPOINT_RETRY_S
    ) -> bool:
        retrying = Retrying(
            retry=retry_if_exception(_is_retryable),
            stop=stop_after_delay(stop_after_s),
            wait=wait_exponential(multiplier=FIRST_RETRY_WAIT_S, max=10.0),
            reraise=True,
        )
        try:
            for attempt in retrying:
                with attempt:
                    self._client.post(path, json=body).raise_for_status()
        except httpx.HTTPError as exc:
            _warn(f"POST {path} {body} not delivered, giving up: {exc!r}")
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
        stop_after_s = WRITING_RETRY_S if state == "WRITING" else CHECKPOINT_RETRY_S
        if state == "COMMITTED":
            # No step without its figures: the rows of the steps this checkpoint holds reach
            # the service before the commit does. Once the service knows of the commit, a
            # crash resumes from it, and those steps are never trained or reported again.
            deadline = time.monotonic() + stop_after_s
            self._drain(timeout_s=stop_after_s)
            stop_after_s = max(deadline - time.monotonic(), FIRST_RETRY_WAIT_S)
        return self._post_with_retry("/checkpoints", body, stop_after_s)

    def anomaly(self, step: int, kind: str, figure: str, message: str) -> None:
        # The service's errors endpoint, kind worker:anomaly: read when the job ends
        # (service/runs/rollback.py), so it is delivered, within a bound, before the exit.
        self._drain(timeout_s=WRITING_RETRY_S)  # the timeline shows the steps up to it
        body = error_body(
            self.rank, self.node, "worker:anomaly", f"{kind} {figure}: {message}", step
        )
        self._post_with_retry("/errors", body)

    def _drain(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.flush_once() and time.monotonic() < deadline:
            time.sleep(0.5)

    def finish(self, final_step: int, final_checkpoint_step: int) -> None:
        self._drain(timeout_s=CHECKPOINT_RETRY_S)  # the service sees every step before "finished"
        body = {"final_step": final_step, "final_checkpoint_step": final_checkpoint_step}
        self._post_with_retry("/finish", body)

    def close(self, drain_timeout_s: float = 10.0) -> None:
        self._stop.set()
        self._thread.join()
        self._drain(timeout_s=drain_timeout_s)
        if self.pending():
            _warn(f"{self.pending()} metric rows never delivered")
        self._client.close()
