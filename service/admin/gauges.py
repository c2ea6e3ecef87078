"""Gauges read from Postgres at scrape time: the platform's state as on-call's dashboard
shows it (runs and nodes by state, open incidents, the spare pool, goodput). The app hands
the collector to service/observability/http.py, which serves it at GET /metrics.

Read on every scrape (every 15-60 s) in one short read-only transaction, with queries that
stay cheap however long runs train: counts grouped in SQL, and goodput from each attempt's
stored progress summary rather than every step ever reported.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.clusters.reachability import reachability
from service.clusters.registry import cluster_names
from service.config import Settings, get_settings
from service.models import Attempt, Incident, Node, NodeState, Run, RunState
from service.models.base import utcnow
from service.recovery.signals import OPEN_STATES
from service.recovery.spares import configured_target, get_target
from service.runs.goodput import achieved_mfu, compute_goodput
from service.runs.repository import checkpoints

log = logging.getLogger(__name__)
GOODPUT_LOW_AFTER_S = float(Settings.model_fields["goodput_low_after_s"].default)
SessionFactory = Callable[[], AbstractContextManager[Session]]


def _gauge(name: str, doc: str, labels: list[str] | None = None) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


class StateCollector(Collector):
    """Yields the state gauges; `runyard_database_up` is 0 (and nothing else) when Postgres
    cannot be read, so an alert can tell "Postgres down" from "no runs"."""

    def __init__(
        self, session_factory: SessionFactory, goodput_low_after_s: float = GOODPUT_LOW_AFTER_S
    ) -> None:
        self.session_factory = session_factory
        self.goodput_low_after_s = goodput_low_after_s

    def collect(self) -> Iterator[Metric]:
        up = _gauge("runyard_database_up", "1 if the service could read Postgres at scrape time.")
        try:
            with self.session_factory() as session:
                families = list(self._read(session))
        except Exception:  # any database failure: report it as a metric, not a 500
            log.exception("metrics: cannot read Postgres")
            up.add_metric([], 0)
            yield up
            return
        up.add_metric([], 1)
        yield up
        yield from families

    def _read(self, session: Session) -> Iterator[Metric]:
        runs = _gauge("runyard_runs", "Runs by state.", ["state"])
        by_state = dict(session.execute(select(Run.state, func.count()).group_by(Run.state)).all())
        for state in RunState:
            runs.add_metric([state.value], by_state.get(state, 0))
        yield runs

        yield from self._nodes(session)
        yield from self._clusters(session)

        yield from self._heartbeats(session)
        yield from self._slow_nodes(session)
        yield from self._incidents(session)
        yield from self._running_runs(session)

    def _nodes(self, session: Session) -> Iterator[Metric]:
        """Nodes by state, and the spare pool, per cluster (every configured one, so that
        a cluster with no node yet reads 0 rather than nothing)."""
        nodes = _gauge(
            "runyard_nodes", "Nodes by runyard state, per cluster.", ["cluster", "state"]
        )
        counts = session.execute(
            select(Node.cluster, Node.state, func.count()).group_by(Node.cluster, Node.state)
        ).all()
        by_state = {(cluster, state): n for cluster, state, n in counts}
        names = dict.fromkeys([*cluster_names(get_settings()), *(c for c, _ in by_state)])
        for cluster in names:
            for node_state in NodeState:
                nodes.add_metric(
                    [cluster, node_state.value], by_state.get((cluster, node_state), 0)
                )
        yield nodes
        spares = _gauge(
            "runyard_spare_pool_nodes", "Nodes held in the hot-spare pool now.", ["cluster"]
        )
        target = _gauge(
            "runyard_spare_pool_target_nodes", "The spare pool's target size.", ["cluster"]
        )
        for cluster in names:
            spares.add_metric([cluster], by_state.get((cluster, NodeState.SPARE), 0))
            configured = configured_target(get_settings(), cluster)
            target.add_metric([cluster], get_target(session, cluster, configured))
        yield spares
        yield target

    def _clusters(self, session: Session) -> Iterator[Metric]:
        """Each configured cluster's controller as the reconciler last read it (Postgres):
        answering or not, and for how long not; its runs fail over past the site's limit."""
        reachable = _gauge(
            "runyard_cluster_reachable",
            "1 while the cluster's slurmctld answered the reconciler's last read, else 0.",
            ["cluster"],
        )
        silent = _gauge(
            "runyard_cluster_unreachable_seconds",
            "Seconds since the cluster's slurmctld last answered the reconciler (0 when it "
            "answers); its runs move to another cluster past RUNYARD_FAILOVER_AFTER_S.",
            ["cluster"],
        )
        reach, now = reachability(session), utcnow()
        for cluster in cluster_names(get_settings()):
            since = reach[cluster].unreachable_since if cluster in reach else None
            reachable.add_metric([cluster], 0.0 if since else 1.0)
            silent.add_metric([cluster], (now - since).total_seconds() if since else 0.0)
        yield reachable
        yield silent

    def _heartbeats(self, session: Session) -> Iterator[Metric]:
        lag = _gauge(
            "runyard_node_heartbeat_lag_seconds",
            "Seconds since the node's health agent was last heard from.",
            ["cluster", "node"],
        )
        now = utcnow()
        for cluster, name, last in session.execute(
            select(Node.cluster, Node.name, Node.last_heartbeat_at).where(
                Node.last_heartbeat_at.is_not(None)
            )
        ).all():
            if last is not None:
                lag.add_metric([cluster, name], max((now - last).total_seconds(), 0.0))
        yield lag

    def _slow_nodes(self, session: Session) -> Iterator[Metric]:
        slow = _gauge(
            "runyard_node_slow",
            "1 while the node is flagged SLOW: its ranks' update time persistently above its "
            "peers' median by the margin (service/nodes/stragglers.py); else 0.",
            ["cluster", "node"],
        )
        ratio = _gauge(
            "runyard_node_slow_ratio",
            "The node's last update time over its peers' median, for nodes slow in their "
            "last report or flagged.",
            ["cluster", "node"],
        )
        for cluster, name, since, last_ratio, count in session.execute(
            select(Node.cluster, Node.name, Node.slow_since, Node.slow_ratio, Node.num_slow_reports)
        ).all():
            slow.add_metric([cluster, name], 1.0 if since is not None else 0.0)
            if last_ratio is not None and (since is not None or count):
                ratio.add_metric([cluster, name], last_ratio)
        yield slow
        yield ratio

    def _incidents(self, session: Session) -> Iterator[Metric]:
        open_ = _gauge(
            "runyard_incidents_open",
            "Incidents whose recovery has not finished, by state (WAITING: no spare).",
            ["state"],
        )
        rows = dict(
            session.execute(
                select(Incident.state, func.count())
                .where(Incident.state.in_(OPEN_STATES))
                .group_by(Incident.state)
            ).all()
        )
        for state in OPEN_STATES:
            open_.add_metric([state.value], rows.get(state, 0))
        yield open_
        oldest = session.scalar(
            select(func.min(Incident.signal_at)).where(Incident.state.in_(OPEN_STATES))
        )
        age = _gauge(
            "runyard_incident_oldest_open_age_seconds",
            "Age of the oldest unfinished recovery (0 when none): a run stuck in recovery.",
        )
        age.add_metric([], (utcnow() - oldest).total_seconds() if oldest else 0.0)
        yield age

    def _running_runs(self, session: Session) -> Iterator[Metric]:
        # /metrics answers anyone who can reach the service (Prometheus scrapes it without a
        # token), so nothing here names a run or a team: figures over all running runs only.
        # Each run's own goodput and MFU are in the API, for its team (`runyard run show`).
        below = _gauge(
            "runyard_runs_below_goodput_budget",
            "Running runs whose goodput so far is below the plan's, once they have held their "
            "nodes for RUNYARD_GOODPUT_LOW_AFTER_S (start-up counts as lost time): the "
            "judgement goodput.low notifications make, counted.",
        )
        mfu = _gauge(
            "runyard_running_mfu_ratio",
            "Model FLOPs utilisation of the running runs' last reported steps (PaLM "
            "convention), each run weighted by its GPUs; absent when none reported.",
        )
        running = session.scalars(
            select(Run).where(Run.state == RunState.RUNNING).order_by(Run.id)
        ).all()
        num_below, flops, gpus = 0, 0.0, 0
        for run in running:
            attempts = session.scalars(
                select(Attempt).where(Attempt.run_id == run.id).order_by(Attempt.number)
            ).all()
            figures = compute_goodput(run, attempts, checkpoints(session, run.id))
            plan = run.config.get("plan") or {}
            judged = figures.allocated_s >= self.goodput_low_after_s
            if judged and figures.goodput is not None and "goodput" in plan:
                num_below += figures.goodput < float(plan["goodput"])
            if (value := achieved_mfu(plan, run.tokens_per_s)) is not None:
                run_gpus = run.num_nodes * run.gpus_per_node
                flops, gpus = flops + value * run_gpus, gpus + run_gpus
        below.add_metric([], num_below)
        yield below
        if gpus:
            mfu.add_metric([], flops / gpus)
        yield mfu
