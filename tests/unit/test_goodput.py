"""Goodput comes from the attempts' stored progress summaries, kept by the progress reports
themselves, and equals what the old scan over every metric row gave, without reading one."""

from __future__ import annotations

import importlib.util
import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from types import ModuleType
from typing import Any

import pytest
from sqlalchemy import event, func, select, text
from sqlalchemy.orm import Session

from service.models import Attempt, AttemptState, Metric, Run, RunState
from service.models.base import utcnow
from service.worker_protocol.schemas import CheckpointReport, ProgressReport, StepMetric
from service.workers import service as workers
from tests.conftest import REPO_ROOT
from tests.fixtures.rows import add_attempt, add_run, checkpoint_path

STEPS_PER_REPORT = 5
REPORT_EVERY_S = 10


class Clock:
    """The service's clock in workers/service.py, set by the test (reports carry no time)."""

    def __init__(self, start: datetime) -> None:
        self.start, self.now = start, start

    def at(self, seconds: float) -> None:
        self.now = self.start + timedelta(seconds=seconds)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock(utcnow() - timedelta(hours=1))
    monkeypatch.setattr(workers, "utcnow", lambda: clock.now)
    return clock


def report_steps(
    session: Session, clock: Clock, attempt: Attempt, first_step: int, last_step: int, at_s: float
) -> None:
    """Rank 0 reports STEPS_PER_REPORT steps every REPORT_EVERY_S seconds from `at_s` on."""
    for i, start in enumerate(range(first_step, last_step + 1, STEPS_PER_REPORT)):
        clock.at(at_s + i * REPORT_EVERY_S)
        steps = range(start, min(start + STEPS_PER_REPORT, last_step + 1))
        report = ProgressReport(rank=0, metrics=[StepMetric(step=s, loss=1.0) for s in steps])
        workers.record_progress(session, attempt.id, report)


def end(attempt: Attempt, state: AttemptState, clock: Clock, at_s: float) -> None:
    clock.at(at_s)
    attempt.state, attempt.ended_at = state, clock.now


def a_run_that_failed_once(session: Session, clock: Clock) -> Run:
    """Attempt 1 trains steps 1-30 (reports at 5, 15, ... 55 s), commits step 20 at 45 s and
    dies at 80 s; attempt 2 starts at 100 s from step 20, reports from 110 s to 180 s, and the
    run ends at 200 s."""
    spec = {"name": "seeded", "model": "tiny", "nodes": 2, "gpus_per_node": 1, "steps": 60}
    run = add_run(session, RunState.RUNNING, spec={**spec, "seq_len": 128, "global_batch": 8})
    first = add_attempt(session, run, 1, AttemptState.RUNNING, started_at=clock.start)
    report_steps(session, clock, first, 1, 20, at_s=5)
    clock.at(41)
    path = checkpoint_path(run, 20)
    workers.record_checkpoint(
        session, first.id, CheckpointReport(step=20, path=path, state="WRITING")
    )
    clock.at(45)
    committed = CheckpointReport(step=20, path=path, state="COMMITTED", write_s=1.0)
    workers.record_checkpoint(session, first.id, committed)
    report_steps(session, clock, first, 21, 30, at_s=45)
    end(first, AttemptState.FAILED, clock, at_s=80)
    clock.at(100)
    second = add_attempt(
        session, run, 2, AttemptState.RUNNING, started_at=clock.now, resume_step=20
    )
    report_steps(session, clock, second, 21, 60, at_s=110)
    end(second, AttemptState.SUCCEEDED, clock, at_s=200)
    run.state, run.ended_at = RunState.SUCCEEDED, clock.now
    session.flush()
    return run


@pytest.fixture
def statements(db_session: Session) -> Iterator[list[str]]:
    """Every SQL statement the test's connection runs from here on."""
    seen: list[str] = []
    conn = db_session.connection()

    def record(*args: Any) -> None:
        seen.append(args[2])

    event.listen(conn, "before_cursor_execute", record)
    yield seen
    event.remove(conn, "before_cursor_execute", record)


def test_each_report_keeps_the_summary_the_old_scan_derived(
    db_session: Session, clock: Clock
) -> None:
    run = a_run_that_failed_once(db_session, clock)
    scanned = db_session.execute(
        select(Metric.attempt_id, func.max(Metric.step), func.max(Metric.recorded_at))
        .where(Metric.run_id == run.id)
        .group_by(Metric.attempt_id)
    ).all()
    attempts = db_session.scalars(select(Attempt).where(Attempt.run_id == run.id)).all()
    stored = {(a.id, a.last_step, a.last_progress_at) for a in attempts}
    assert stored == set(scanned)
    assert {a.last_step for a in attempts} == {30, 60}


def test_the_run_endpoint_gives_the_scan_figures_without_reading_metrics(
    db_session: Session, clock: Clock, api: Any, statements: list[str]
) -> None:
    run = a_run_that_failed_once(db_session, clock)
    statements.clear()

    goodput = api.get(f"/v1/runs/{run.id}").json()["goodput"]

    assert statements and not [s for s in statements if re.search(r"\bmetrics\b", s)]
    # What the scan gave for this run, from the times in a_run_that_failed_once:
    lost = goodput["lost"]
    assert lost["startup_and_load_s"] == pytest.approx(5 + 10)  # start -> first step, twice
    assert lost["recomputed_steps_s"] == pytest.approx(55 - 45)  # commit -> last report
    assert lost["detection_s"] == pytest.approx(80 - 55)  # last report -> the attempt's end
    assert lost["drain_and_resubmit_s"] == pytest.approx(100 - 80)
    assert lost["checkpoint_stalls_s"] == pytest.approx(1.0)
    assert goodput["allocated_s"] == pytest.approx(200)
    assert goodput["productive_s"] == pytest.approx(200 - 15 - 10 - 25 - 20 - 1)


def migration_0007() -> ModuleType:
    path = REPO_ROOT / "migrations" / "versions" / "0007_typed_stop_reasons.py"
    spec = importlib.util.spec_from_file_location("migration_0007", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_migration_backfills_old_runs_to_the_same_goodput(
    db_session: Session, clock: Clock, api: Any
) -> None:
    run = a_run_that_failed_once(db_session, clock)
    before = api.get(f"/v1/runs/{run.id}").json()["goodput"]
    # As a run recorded before migration 0007 looks: metrics, but no summaries.
    db_session.query(Attempt).filter(Attempt.run_id == run.id).update(
        {Attempt.last_step: None, Attempt.last_progress_at: None}
    )
    db_session.expire_all()
    forgotten = api.get(f"/v1/runs/{run.id}").json()["goodput"]
    assert forgotten["lost"]["recomputed_steps_s"] != before["lost"]["recomputed_steps_s"]

    db_session.execute(text(migration_0007().BACKFILL_PROGRESS))
    db_session.expire_all()

    after = api.get(f"/v1/runs/{run.id}").json()["goodput"]
    assert after["lost"] == before["lost"] and after["allocated_s"] == before["allocated_s"]


def test_a_held_out_loss_is_in_the_runs_timeline(db_session: Session) -> None:
    from service.models import RunEvent
    from service.worker_protocol.schemas import HeldOutLoss

    run = add_run(db_session)
    attempt = add_attempt(db_session, run, 1, AttemptState.RUNNING)
    report = ProgressReport(
        rank=0,
        metrics=[StepMetric(step=50, loss=2.0)],
        validation=[HeldOutLoss(step=50, loss=2.25)],
    )
    workers.record_progress(db_session, attempt.id, report)
    db_session.flush()
    events = db_session.scalars(
        select(RunEvent).where(RunEvent.run_id == run.id, RunEvent.kind == "run.validation")
    ).all()
    assert [e.data for e in events] == [{"step": 50, "loss": 2.25}]
    assert events[0].attempt_id == attempt.id
