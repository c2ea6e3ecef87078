"""Prometheus metrics: what a dashboard and its alerts read from GET /metrics.

Two kinds, on one registry of our own (so building the app twice in tests never registers a
metric twice):
- Events counted where they happen (node signals, run timeline entries, node state changes,
  recovery phases, API requests). In-process counters: each service process exposes its own
  and Prometheus sums them; a restart resets them, which `rate()`/`increase()` handle.
- State read from Postgres at scrape time (runs and nodes by state, the spare pool, heartbeat
  lag, goodput and MFU of running runs) by `StateCollector` in service/admin/gauges.py,
  which the app registers here. Postgres is the source of truth, so these are right in
  every process and after any restart.

Names follow the Prometheus conventions (prometheus.io/docs/practices/naming): a `runyard_`
prefix, base units in the name (`_seconds`, `_ratio`), `_total` on counters, and labels for
dimensions instead of one metric per value.
"""

from __future__ import annotations

from datetime import datetime

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)
from prometheus_client.registry import Collector

REGISTRY = CollectorRegistry(auto_describe=True)
for _standard in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
    REGISTRY.register(_standard)

# Recovery phases run from seconds (detection, drain) to tens of minutes (waiting in the
# queue for a node, loading a 405B checkpoint): buckets span 1 s to 2 h.
RECOVERY_BUCKETS_S = (1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200)
# API calls: a heartbeat takes milliseconds, a run submission plans for up to a second.
API_BUCKETS_S = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)

NODE_EVENTS = Counter(
    "runyard_node_events",
    "Signals health agents reported (Xid, SXid, NVML, NCCL), by kind, Xid/SXid code and the "
    "action the classification table chose, per cluster.",
    ["cluster", "kind", "code", "action"],
    registry=REGISTRY,
)
RUN_EVENTS = Counter(
    "runyard_run_events",
    "Entries written to run timelines (run.failed, attempt.running, recovery.no_spare, ...).",
    ["kind"],
    registry=REGISTRY,
)
NODE_TRANSITIONS = Counter(
    "runyard_node_state_transitions",
    "runyard node state changes; a node that keeps going SUSPECT or DRAINED is flapping. "
    "A node is (cluster, node): names repeat across clusters.",
    ["cluster", "node", "to_state"],
    registry=REGISTRY,
)
INCIDENTS_OPENED = Counter(
    "runyard_incidents_opened",
    "Failure signals runyard acted on (one incident each), by cluster (the node's, or the "
    "run's), signal and recovery action.",
    ["cluster", "signal", "action"],
    registry=REGISTRY,
)
RECOVERY_DURATION = Histogram(
    "runyard_recovery_duration_seconds",
    "How long each phase of a recovery took, observed when the phase ends. Phases: detect "
    "(signal to incident), drain, stop (attempt ended), resubmit, start (job running), "
    "first_step (training again); total is signal to first resumed step.",
    ["phase"],
    buckets=RECOVERY_BUCKETS_S,
    registry=REGISTRY,
)
API_LATENCY = Histogram(
    "runyard_http_request_duration_seconds",
    "API request latency by method, route template and status code.",
    ["method", "route", "status_code"],
    buckets=API_BUCKETS_S,
    registry=REGISTRY,
)
RECONCILE_DURATION = Histogram(
    "runyard_reconcile_tick_duration_seconds",
    "Duration of one reconcile tick (all steps) in the process holding the reconciler lock.",
    buckets=(0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 30, 60),
    registry=REGISTRY,
)
RECONCILE_LAST_TICK = Gauge(
    "runyard_reconcile_last_tick_timestamp_seconds",
    "Unix time the last reconcile tick ended; stale while the reconciler is stuck or stopped.",
    registry=REGISTRY,
)

# The recovery phases in order: (stamps that may start it, first one set wins; stamp ending it).
RECOVERY_PHASES: dict[str, tuple[tuple[str, ...], str]] = {
    "detect": (("signal_at",), "detected_at"),
    "drain": (("detected_at",), "drained_at"),
    "stop": (("drained_at", "detected_at"), "attempt_ended_at"),
    "resubmit": (("attempt_ended_at",), "submitted_at"),
    "start": (("submitted_at",), "running_at"),
    "first_step": (("running_at",), "first_step_at"),
    "total": (("signal_at",), "first_step_at"),
}


def observe_recovery_phase(phase: str, started: datetime | None, ended: datetime | None) -> None:
    """Record one finished recovery phase; a phase without both stamps did not happen."""
    if started is None or ended is None:
        return
    RECOVERY_DURATION.labels(phase=phase).observe(max((ended - started).total_seconds(), 0.0))


def observe_incident(incident: object, *phases: str) -> None:
    """Observe `phases` of an incident from its stamps (called where each stamp is written).

    Observed inside the transaction that writes the stamp: a transaction rolled back and
    retried counts twice. Rare (a Slurm call failing mid-recovery), and cheaper than a
    second write path; the stamps in Postgres stay the exact record.
    """
    for phase in phases:
        starts, end = RECOVERY_PHASES[phase]
        started = next((v for a in starts if (v := getattr(incident, a)) is not None), None)
        observe_recovery_phase(phase, started, getattr(incident, end))


def count_node_event(
    cluster: str, kind: str, code: int | None, action: str, count: int = 1
) -> None:
    code_label = "" if code is None else str(code)
    NODE_EVENTS.labels(cluster=cluster, kind=kind, code=code_label, action=action).inc(count)


def count_run_event(kind: str) -> None:
    RUN_EVENTS.labels(kind=kind).inc()


def count_node_transition(cluster: str, node: str, to_state: str) -> None:
    NODE_TRANSITIONS.labels(cluster=cluster, node=node, to_state=to_state).inc()


def count_incident(cluster: str, signal: str, action: str) -> None:
    INCIDENTS_OPENED.labels(cluster=cluster, signal=signal, action=action).inc()


def register_state_collector(collector: Collector) -> None:
    """Add the scrape-time database collector once per process."""
    if getattr(register_state_collector, "done", False):
        return
    REGISTRY.register(collector)
    register_state_collector.done = True  # type: ignore[attr-defined]
