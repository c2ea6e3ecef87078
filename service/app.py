"""create_app(): routers, error handlers, and the reconcile loop's lifespan."""

from __future__ import annotations

import asyncio
import gc
import os
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from service import integrations
from service.admin.endpoints import router as admin_router
from service.admin.gauges import StateCollector
from service.admin.users import router as users_router
from service.agents.endpoints import router as agents_router
from service.auth.deps import watch_revocations
from service.auth.endpoints import router as auth_router
from service.clusters.endpoints import router as clusters_router
from service.clusters.registry import clusters
from service.config import get_settings
from service.db import get_engine, session_scope
from service.errors import (
    ERROR_RESPONSES,
    document_errors,
    install_error_handlers,
    render_unavailable,
)
from service.limits import BodySizeLimit
from service.nodes.endpoints import router as nodes_router
from service.notifications.endpoints import router as notifications_router
from service.observability.http import install_observability
from service.observability.logging import configure_logging
from service.plans.endpoints import router as plans_router
from service.reconcile.loop import run_forever
from service.runs.endpoints import router as runs_router
from service.runs.logs import router as run_logs_router
from service.slurm.commands import SlurmError
from service.sweeps.endpoints import router as sweeps_router
from service.tracking.endpoints import router as tracking_router
from service.workers.endpoints import router as worker_router

# Python's cyclic garbage collector pauses the whole process while it walks the heap. With
# its default thresholds (a young-generation pass every 700 allocations, full passes over
# every object the app holds) those pauses were the tail of the API's latency under a
# fleet's load: 100-200 ms at p99 against ~25 ms at p50 (bench/control_plane.py). The
# objects built at startup (routes, schemas, SQLAlchemy metadata) live as long as the
# process, so they are frozen out of every pass, and the young generation is collected
# less often. Cycles are still collected, in smaller and rarer pauses.
GC_THRESHOLDS = (20_000, 20, 100)


def tune_garbage_collector() -> None:
    gc.collect()
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


@asynccontextmanager
async def lifespan(app: FastAPI) -> AsyncIterator[None]:
    settings = get_settings()
    # The clusters, read now: a clusters file that is wrong stops the start, naming the
    # field, rather than the first request or tick that needs it.
    clusters(settings)
    if settings.slurm_conf is not None:
        # submitit calls sbatch with our environment; this is how it finds the cluster.
        os.environ["SLURM_CONF"] = str(settings.slurm_conf)
    stop = threading.Event()
    thread, background = None, []
    if settings.run_reconciler:
        thread = threading.Thread(
            target=run_forever, args=(settings, stop), name="reconciler", daemon=True
        )
        thread.start()
        # Webhooks and experiment trackers: threads of their own beside the reconciler.
        background = integrations.start(settings, stop)
    # Revocations made through other service processes reach this one's principal cache.
    revocations = asyncio.create_task(watch_revocations(), name="revocations")
    tune_garbage_collector()  # last: what startup built is frozen
    yield
    revocations.cancel()
    stop.set()
    if thread is not None:
        thread.join(timeout=10)
    for worker in background:
        worker.join(timeout=10)


def create_app() -> FastAPI:
    configure_logging(get_settings().log_format)
    app = FastAPI(
        # runyard's observability is its Prometheus metrics and JSON logs; FastAPI's native
        # OpenTelemetry support looked for configured providers on every request.
        telemetry={"tracing": False, "metrics": False, "logs": False, "operation_spans": False},
        title="runyard",
        version="0.1.0",
        lifespan=lifespan,
        description="Training-run orchestration for Slurm clusters.",
        responses=ERROR_RESPONSES,
    )
    install_error_handlers(app)
    render_unavailable(
        app,
        SlurmError,
        "slurm_unavailable",
        "Slurm did not answer ({}); try again, or check slurmctld (docs/operations.md)",
    )
    # Postgres down, restarting or out of connections, or a transaction it cancelled
    # (psycopg's serialization failures and deadlocks are operational errors too): all are
    # worth another try, and none left a half-written change behind.
    render_unavailable(
        app,
        OperationalError,
        "database_unavailable",
        "the database could not complete the request ({}); try again, or check Postgres "
        "(docs/operations.md)",
    )
    document_errors(app)
    app.add_middleware(BodySizeLimit, max_bytes=get_settings().max_body_bytes)
    install_observability(app, StateCollector(session_scope, get_settings().goodput_low_after_s))
    app.include_router(runs_router)
    app.include_router(run_logs_router)
    app.include_router(sweeps_router)
    app.include_router(clusters_router)
    app.include_router(nodes_router)
    app.include_router(agents_router)
    app.include_router(worker_router)
    app.include_router(admin_router)
    app.include_router(users_router)
    app.include_router(auth_router)
    app.include_router(plans_router)
    app.include_router(notifications_router)
    app.include_router(tracking_router)

    @app.get("/healthz", tags=["health"])
    def healthz() -> dict[str, str]:
        """Liveness plus a database round trip."""
        with get_engine().connect() as conn:
            conn.execute(text("SELECT 1"))
        return {"status": "ok"}

    return app
