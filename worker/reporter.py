"""Reports from rank 0 to the service, without ever stalling or killing training.

The reporters are runyard-client's (runyard_client/reporting.py, http_reporter.py): one
implementation for runyard's trainer and for a team's own script (worker/entrypoint.py),
so both speak the same protocol and behave alike through an outage. What is the trainer's
alone stays here: reading the attempt's WorkerRunConfig (pydantic, contract), which a
team's script never needs. No torch here: entry.py imports this before it needs torch.
"""

from __future__ import annotations

import json

import pydantic
from runyard_client import http_reporter
from runyard_client.errors import ServiceError
from runyard_client.http_reporter import HttpReporter, attempt_url, error_body, post_error
from runyard_client.reporting import FileReporter, Reporter
from runyard_client.transport import request, request_headers, with_retries

from contract import WorkerRunConfig
from worker.errors import DoNotRetryError

__all__ = [
    "FileReporter",
    "HttpReporter",
    "Reporter",
    "error_body",
    "fetch_config",
    "post_error",
]


def fetch_config(service_url: str, attempt_id: int, timeout_s: float = 60.0) -> WorkerRunConfig:
    """GET this attempt's resolved config, retrying for up to `timeout_s` while the service
    is unreachable. A 4xx answer (a protocol the service does not speak among them) or an
    invalid body is final: DoNotRetryError."""
    url = f"{attempt_url(service_url, attempt_id)}/config"
    headers = request_headers()
    try:
        content = with_retries(
            lambda: request("GET", url, headers=headers),
            stop_after_s=timeout_s,
            first_wait_s=http_reporter.FIRST_RETRY_WAIT_S,  # read at the call: tests set it
            max_wait_s=http_reporter.MAX_RETRY_WAIT_S,
        )
    except ServiceError as exc:
        if exc.retryable:
            raise
        raise DoNotRetryError(f"GET {url}: {exc.status} {exc.detail[:200]}") from exc
    try:
        return WorkerRunConfig.model_validate(json.loads(content))
    except (pydantic.ValidationError, json.JSONDecodeError) as exc:
        raise DoNotRetryError(f"invalid config from {url}: {exc}") from exc
