"""The API's own observability: request latency, one log line per request, GET /metrics.

The middleware is plain ASGI (not BaseHTTPMiddleware), so the endpoint runs in its context:
the ids a router-wide dependency binds from the path are on every line the endpoint logs,
sync endpoints included (Starlette copies the context into its thread pool).
"""

from __future__ import annotations

import logging
import time

from fastapi import Depends, FastAPI, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import Collector
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.observability.logging import bind, ids_from_path, log_context
from service.observability.metrics import API_LATENCY, REGISTRY, register_state_collector

log = logging.getLogger("runyard.access")

# Requests that change state, and every failure, are logged at info level; reads (people's
# `watch` and `logs -f` poll every second or two) and the agents' and ranks' periodic
# reports only at debug level, so the log stays readable on a 1,000-node cluster.
PERIODIC_ROUTES = {
    "/v1/nodes/{name}/heartbeat",
    "/v1/worker/attempts/{attempt_id}/progress",
}


def access_level(method: str, route: str, status: int) -> int:
    if status >= 400:
        return logging.INFO if status < 500 else logging.ERROR
    if method in ("GET", "HEAD") or route in PERIODIC_ROUTES:
        return logging.DEBUG
    return logging.INFO


class RequestObservability:
    """Times each request, logs it with the ids its path names, and feeds the histogram."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500  # what the client sees if the app raises before answering

        async def send_and_note(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        started = time.perf_counter()
        with log_context():  # a fresh context per request, filled by `bind_request_ids`
            try:
                await self.app(scope, receive, send_and_note)
            finally:
                # Routing filled these in: the template, not the raw path, labels the
                # metric (one series per route, not per run id or per typo).
                route = getattr(scope.get("route"), "path", "unmatched")
                ids = ids_from_path(scope.get("path_params") or {})
                duration_s = time.perf_counter() - started
                API_LATENCY.labels(scope["method"], route, str(status)).observe(duration_s)
                log.log(
                    access_level(scope["method"], route, status),
                    "%s %s %s %.1f ms",
                    scope["method"],
                    scope["path"],
                    status,
                    duration_s * 1000,
                    extra={
                        **ids,
                        "method": scope["method"],
                        "route": route,
                        "path": scope["path"],
                        "status_code": status,
                        "duration_ms": round(duration_s * 1000, 2),
                    },
                )


async def bind_request_ids(request: Request) -> None:
    """Put the run, attempt or node the URL names on every line the endpoint logs."""
    bind(**ids_from_path(request.path_params))


def install_observability(app: FastAPI, state: Collector) -> None:
    """Add the request middleware and the /metrics endpoint to `app`; `state` is the
    collector of the gauges read from Postgres at scrape time (service/admin/gauges.py)."""
    register_state_collector(state)
    app.add_middleware(RequestObservability)
    # A router-wide dependency runs before every endpoint included after this call.
    app.router.dependencies.append(Depends(bind_request_ids))

    @app.get("/metrics", tags=["health"], include_in_schema=False)
    def metrics() -> Response:
        """Prometheus text exposition: runyard's metrics plus the process's own."""
        return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)
