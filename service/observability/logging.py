"""Structured logs: one JSON object per line, with the run, attempt and node it concerns.

At 3 a.m. on-call greps the service log for a run id or a node name; a log shipper indexes
the same fields. Every line carries `run_id`, `attempt_id`, `node` and `incident_id` (null
when the line is about none of them), taken from a context that the code around the log
call sets: the request middleware from the URL's path parameters, the reconciler per
incident it works on. `log.info(..., extra={"run_id": 7})` overrides the context for a line.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import UTC, datetime
from typing import Any

CONTEXT_FIELDS = ("run_id", "attempt_id", "node", "incident_id")
_context: ContextVar[Mapping[str, Any] | None] = ContextVar("runyard_log_context", default=None)

# Path parameter names of our routes -> the log field they fill.
PATH_PARAMS = {"run_id": "run_id", "attempt_id": "attempt_id", "name": "node"}


@contextmanager
def log_context(**fields: Any) -> Iterator[None]:
    """Attach ids to every line logged inside the block (nested blocks add to outer ones)."""
    token = _context.set(
        {**(_context.get() or {}), **{k: v for k, v in fields.items() if v is not None}}
    )
    try:
        yield
    finally:
        _context.reset(token)


def bind(**fields: Any) -> None:
    """Attach ids for the rest of the current context (a request's task)."""
    _context.set({**(_context.get() or {}), **{k: v for k, v in fields.items() if v is not None}})


def ids_from_path(path_params: Mapping[str, Any]) -> dict[str, Any]:
    """The log fields a request's path names (/v1/runs/{run_id}, /v1/nodes/{name}, ...)."""
    fields: dict[str, Any] = {}
    for param, field in PATH_PARAMS.items():
        if param in path_params:
            value = path_params[param]
            fields[field] = int(value) if field.endswith("_id") and str(value).isdigit() else value
    return fields


class JsonFormatter(logging.Formatter):
    """`{"ts", "level", "logger", "message", run_id, attempt_id, node, incident_id, ...}`."""

    def format(self, record: logging.LogRecord) -> str:
        context = _context.get() or {}
        line: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for field in CONTEXT_FIELDS:
            line[field] = getattr(record, field, context.get(field))
        for key in ("method", "route", "path", "status_code", "duration_ms", "client"):
            if hasattr(record, key):
                line[key] = getattr(record, key)
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


def configure_logging(fmt: str = "json", level: int = logging.INFO) -> None:
    """Route every logger (ours, uvicorn's, SQLAlchemy's) through one stderr handler.

    uvicorn installs its own handlers before it imports the app; they are removed here so
    its lines come out in the same format. Its access log is switched off: the request
    middleware logs each request itself, with the ids and the latency.
    """
    handler = logging.StreamHandler()
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s %(message)s"))
    root = logging.getLogger()
    root.handlers = [handler]
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error"):
        logger = logging.getLogger(name)
        logger.handlers, logger.propagate = [], True
    logging.getLogger("uvicorn.access").disabled = True
