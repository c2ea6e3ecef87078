"""Scrape-time gauges of the integrations: tracker exports failing, notifications waiting.
Read from Postgres at each scrape, like service/admin/gauges.py's gauges."""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, literal_column, select

from service.db import session_scope
from service.models import (
    DeliveryState,
    ExportState,
    NotificationDelivery,
    TrackerExport,
    TrackerKind,
)
from service.models.base import utcnow
from service.observability.metrics import REGISTRY

log = logging.getLogger(__name__)


class IntegrationsCollector(Collector):
    def collect(self) -> Iterator[Metric]:
        failing = GaugeMetricFamily(
            "runyard_tracker_exports_failing",
            "Unfinished tracker exports whose last try failed, by tracker (training is not "
            "affected; the export catches up when the tracker answers).",
            labels=["tracker"],
        )
        behind = GaugeMetricFamily(
            "runyard_tracker_exports_unfinished",
            "Tracker exports still going (runs training, or their last steps not out yet).",
            labels=["tracker"],
        )
        pending = GaugeMetricFamily(
            "runyard_notification_deliveries_pending",
            "Notifications not delivered yet (retried with backoff).",
        )
        oldest = GaugeMetricFamily(
            "runyard_notification_oldest_pending_age_seconds",
            "Age of the oldest notification not delivered yet (0 when none).",
        )
        try:
            with session_scope() as session:
                # One expression, no bound parameter: Postgres matches the GROUP BY to it.
                bad = (TrackerExport.num_failures > literal_column("0")).label("failing")
                rows = session.execute(
                    select(TrackerExport.tracker, bad, func.count())
                    .where(TrackerExport.state == ExportState.EXPORTING)
                    .group_by(TrackerExport.tracker, bad)
                ).all()
                waiting, since = session.execute(
                    select(func.count(), func.min(NotificationDelivery.created_at)).where(
                        NotificationDelivery.state == DeliveryState.PENDING
                    )
                ).one()
        except Exception:  # runyard_database_up already says so
            log.exception("metrics: cannot read the integrations' state")
            return
        for kind in TrackerKind:
            failing.add_metric([kind.value], sum(n for k, bad, n in rows if k == kind and bad))
            behind.add_metric([kind.value], sum(n for k, _, n in rows if k == kind))
        pending.add_metric([], waiting)
        oldest.add_metric([], (utcnow() - since).total_seconds() if since else 0.0)
        yield from (failing, behind, pending, oldest)


def register_collector() -> None:
    """Once per process."""
    if getattr(register_collector, "done", False):
        return
    REGISTRY.register(IntegrationsCollector())
    register_collector.done = True  # type: ignore[attr-defined]
