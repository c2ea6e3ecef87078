"""The exporters: one thread per tracker kind, each led by one service process at a time.

Each kind has its own Postgres advisory lock (as the reconciler has, service/leader.py), so
two replicas never export the same run to the same tracker at once, and its own thread, so
a slow or unreachable MLflow server delays neither TensorBoard nor W&B, nor the reconciler,
nor any request; training never talks to a tracker at all.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from sqlalchemy import exists, func, literal, select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from service.config import Settings
from service.db import get_engine, session_scope
from service.leader import LeaderLock
from service.models import ExportState, Run, TrackerExport, TrackerKind
from service.tracking.export import Exporter, due_exports
from service.tracking.records import TrackerSink

log = logging.getLogger(__name__)

# "runyard exporter" + the kind's position: one advisory lock per tracker kind, apart
# from the reconciler's (service/leader.py).
LOCK_KEY_BASE = 0x72756E7900
LOCK_KEYS = {kind: LOCK_KEY_BASE + i for i, kind in enumerate(TrackerKind, start=1)}


def make_sink(kind: TrackerKind, settings: Settings) -> TrackerSink:
    """The tracker's client (imported only here: MLflow and W&B take seconds to import)."""
    if kind == TrackerKind.MLFLOW:
        from service.tracking.mlflow_sink import MlflowSink

        return MlflowSink(settings)
    if kind == TrackerKind.WANDB:
        from service.tracking.wandb_sink import WandbSink

        return WandbSink(settings)
    from service.tracking.tensorboard_sink import TensorBoardSink

    return TensorBoardSink(settings)


def ensure_exports(session: Session, kind: TrackerKind) -> None:
    """An export row for every run whose spec asks for this tracker (created here, not at
    submission: a run is exported from whichever process leads this tracker)."""
    section = Run.spec["tracking"][kind.value]
    if kind == TrackerKind.TENSORBOARD:
        wanted = section.as_string() == "true"
    else:  # a section, not null
        wanted = func.jsonb_typeof(section) == "object"
    missing = ~exists().where(TrackerExport.run_id == Run.id, TrackerExport.tracker == kind)
    candidates = select(Run.id, literal(kind.value), literal(ExportState.EXPORTING.name)).where(
        wanted, missing
    )
    session.execute(
        insert(TrackerExport)
        .from_select(["run_id", "tracker", "state"], candidates)
        .on_conflict_do_nothing(index_elements=["run_id", "tracker"])
    )


class ExportLoop:
    """One tracker kind's exporter, while this process holds that kind's lock."""

    def __init__(
        self,
        kind: TrackerKind,
        settings: Settings,
        sink_factory: Callable[[], TrackerSink] | None = None,
    ) -> None:
        self.kind, self.settings = kind, settings
        self.sink_factory = sink_factory or (lambda: make_sink(kind, settings))
        self.exporter: Exporter | None = None

    def pass_once(self) -> int:
        """Every due export one batch further (a run far behind gets one batch per pass, so
        runs share the tracker); how many moved."""
        with session_scope() as session:
            ensure_exports(session, self.kind)
            due = due_exports(session, self.kind.value)
        if not due:
            return 0
        if self.exporter is None:
            try:
                self.exporter = Exporter(self.sink_factory(), self.settings)
            except Exception as exc:  # no client for this tracker (unset URI, bad install)
                for export_id in due:
                    Exporter.record_failure(session_scope, self.settings, export_id, exc)
                return 0
        moved = 0
        for export_id in due:
            try:
                moved += self.exporter.export(export_id)
            except Exception as exc:  # the tracker failed: back off this export only
                self.exporter.failed(export_id, exc)
        return moved

    def run_forever(self, stop: threading.Event) -> None:
        lock = LeaderLock(get_engine(), key=LOCK_KEYS[self.kind])
        try:
            while not stop.is_set():
                if not lock.try_acquire():
                    stop.wait(self.settings.tracking_export_interval_s)
                    continue
                while not stop.is_set() and lock.held():
                    try:
                        while self.pass_once() and not stop.is_set():
                            pass  # behind: the next batches are due at once
                    except Exception:  # Postgres down, a bug: logged, tried again
                        log.exception("%s export pass failed; retrying", self.kind.value)
                    stop.wait(self.settings.tracking_export_interval_s)
        finally:
            lock.release()
