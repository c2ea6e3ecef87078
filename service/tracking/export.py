"""The export of one run to one tracker, batch by batch, each step once.

The cursor (`tracker_exports.exported_step` and `exported_event_ids`) moves only after
the tracker took the batch: read what is settled (a transaction), send it (none open:
the tracker may be slow or down), record the new cursor (a transaction). A process that
dies between the send and the record, or a send whose outcome is unknown (a timeout
after the tracker stored it), would send the batch again; so before its first batch in a
process, and after any failed send, the exporter asks the tracker what it holds
(`TrackerSink.held`) and starts from there. The tracker, not the cursor, is the truth
after a crash; the cursor is what the service shows and the lower bound it resumes from.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings
from service.db import session_scope
from service.models import ExportState, Run, TrackerExport
from service.models.base import utcnow
from service.tracking import exportable
from service.tracking.records import (
    FinalSummary,
    Held,
    StepRow,
    TrackedEvent,
    TrackedRun,
    TrackerSink,
)

log = logging.getLogger(__name__)


@dataclass
class Batch:
    rows: list[StepRow]
    events: list[TrackedEvent]
    through_step: int
    final: FinalSummary | None  # the run ended and this is its last batch's successor


@dataclass
class Opened:
    """A tracker run this process has reconciled with the tracker."""

    tracker_run_id: str
    final_held: bool


@dataclass
class Exporter:
    """Exports every run of one tracker kind (one per kind, on its own thread)."""

    sink: TrackerSink
    settings: Settings
    # A transaction per use, committed on success (the tests pass their rolled-back one).
    sessions: Callable[[], AbstractContextManager[Session]] = session_scope
    opened: dict[int, Opened] = field(default_factory=dict)  # export id -> its tracker run

    def export(self, export_id: int) -> bool:
        """One step forward for one export: a batch sent, or the end recorded; False when
        there was nothing to do. Raises when the tracker failed (the caller records it)."""
        with self.sessions() as session:
            export = session.get(TrackerExport, export_id)
            assert export is not None
            if export.state == ExportState.FINISHED:
                return False
            run = session.get(Run, export.run_id)
            assert run is not None
            tracked = exportable.tracked_run(run)
            known_id = export.tracker_run_id
            cursor, sent = export.exported_step, set(export.exported_event_ids)
        opened = self.opened.get(export_id)
        if opened is None:
            opened = self._open(export_id, tracked, known_id)
            with self.sessions() as session:
                export = self._row(session, export_id)
                cursor, sent = export.exported_step, set(export.exported_event_ids)
        with self.sessions() as session:
            batch = self._plan(session, export_id, cursor, sent)
            if batch.rows or batch.events:
                self._row(session, export_id).in_flight = {
                    "through_step": batch.through_step,
                    "event_ids": [e.id for e in batch.events],
                    "since": utcnow().isoformat(),
                }
        if batch.rows or batch.events:
            try:
                self.sink.log(
                    opened.tracker_run_id, tracked, batch.rows, batch.events, batch.through_step
                )
            except Exception:
                self.opened.pop(export_id, None)  # did it land? the tracker says, next time
                raise
        if batch.rows or batch.events or batch.through_step > cursor:
            with self.sessions() as session:
                export = self._row(session, export_id)
                export.exported_step = max(export.exported_step, batch.through_step)
                export.exported_event_ids = sorted(sent | {e.id for e in batch.events})
                export.in_flight = None
                self._succeeded(export)
            return True
        if batch.final is not None:
            if not opened.final_held:
                self.sink.finish(opened.tracker_run_id, tracked, batch.final)
            else:
                self.sink.release(opened.tracker_run_id)
            with self.sessions() as session:
                export = self._row(session, export_id)
                export.state, export.finished_at = ExportState.FINISHED, utcnow()
                self._succeeded(export)
            self.opened.pop(export_id, None)
            return True
        return False

    def _open(self, export_id: int, tracked: TrackedRun, known_id: str | None) -> Opened:
        """Find or create the tracker's run and take the cursor from what it holds."""
        tracker_run_id, created = self.sink.open(tracked, known_id)
        held = Held() if created else self.sink.held(tracker_run_id, tracked)
        with self.sessions() as session:
            export = self._row(session, export_id)
            if (
                export.exported_step != held.step
                or set(export.exported_event_ids) != held.event_ids
            ):
                log.info(
                    "tracker %s of run %s holds steps to %s (cursor said %s): resuming from it",
                    export.tracker.value,
                    export.run_id,
                    held.step,
                    export.exported_step,
                )
            export.tracker_run_id = tracker_run_id
            export.exported_step = held.step
            export.exported_event_ids = sorted(held.event_ids)
            export.in_flight = None
        opened = Opened(tracker_run_id, held.final)
        self.opened[export_id] = opened
        return opened

    def _plan(self, session: Session, export_id: int, cursor: int, sent: set[int]) -> Batch:
        export = self._row(session, export_id)
        run = session.get(Run, export.run_id)
        assert run is not None
        settled = exportable.settled_step(session, run)
        rows = exportable.step_rows(session, run, cursor, settled) if settled > cursor else []
        events = exportable.new_events(session, run.id, sent)
        through = rows[-1].step if rows else max(cursor, settled)
        if rows:
            last = rows[-1]
            rows[-1] = StepRow(
                last.step, {**last.figures, **exportable.goodput_figures(session, run)}
            )
        elif through > cursor:
            # Settled steps with no row (lost before this version flushed them): the cursor
            # passes them, with nothing to send but the cursor itself.
            return Batch([], events, through, None)
        final = None
        if run.state.is_terminal and not rows and not events and through >= settled:
            final = exportable.final_summary(session, run)
        return Batch(rows, events, through, final)

    def _row(self, session: Session, export_id: int) -> TrackerExport:
        export = session.get(TrackerExport, export_id)
        assert export is not None
        return export

    def _succeeded(self, export: TrackerExport) -> None:
        export.last_exported_at = utcnow()
        export.num_failures, export.last_error, export.next_try_at = 0, None, None

    def failed(self, export_id: int, error: BaseException) -> None:
        self.record_failure(self.sessions, self.settings, export_id, error)

    @staticmethod
    def record_failure(
        sessions: Callable[[], AbstractContextManager[Session]],
        settings: Settings,
        export_id: int,
        error: BaseException,
    ) -> None:
        """A tracker that failed is tried again later, backing off: it never blocks the
        others, and training never waits for it. `runyard tracking show` shows the error."""
        with sessions() as session:
            export = session.get(TrackerExport, export_id)
            assert export is not None
            export.num_failures += 1
            wait_s = min(
                settings.tracking_export_interval_s * 2**export.num_failures,
                settings.tracking_retry_max_s,
            )
            export.next_try_at = utcnow() + timedelta(seconds=wait_s)
            export.last_error = f"{type(error).__name__}: {error}"[:2000]
        log.warning("tracker export %s failed (%s); next try in %.0f s", export_id, error, wait_s)


def due_exports(session: Session, tracker: str) -> list[int]:
    """This tracker's unfinished exports whose next try is due, oldest run first."""
    now = utcnow()
    return list(
        session.scalars(
            select(TrackerExport.id)
            .where(
                TrackerExport.tracker == tracker,
                TrackerExport.state == ExportState.EXPORTING,
                (TrackerExport.next_try_at.is_(None)) | (TrackerExport.next_try_at <= now),
            )
            .order_by(TrackerExport.run_id)
        ).all()
    )
