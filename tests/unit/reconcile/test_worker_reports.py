"""A worker's progress report sent again after its answer was lost (worker/reporter.py
retries 5xx and timeouts) is applied once: its rows are not stored twice, and a stale copy
arriving after a newer report does not move the run's summary back."""

from __future__ import annotations

from sqlalchemy import func, select

from service.db import session_scope
from service.models import Metric
from service.worker_protocol.schemas import ProgressReport
from service.workers import service as workers
from tests.unit.reconcile.conftest import Cluster
from tests.unit.reconcile.test_checkpoint_trust import live_attempt_id, running


def report(cluster: Cluster, run_id: int, steps: range) -> None:
    body = ProgressReport(
        rank=0, metrics=[{"step": s, "loss": 10.0 / s, "step_time_s": 0.1} for s in steps]
    )
    with session_scope() as session:
        workers.record_progress(session, live_attempt_id(cluster, run_id), body)


def stored_rows(run_id: int) -> int:
    with session_scope() as session:
        return session.scalar(select(func.count()).where(Metric.run_id == run_id)) or 0


def test_a_report_sent_again_is_stored_once_and_never_moves_the_run_back(
    cluster: Cluster,
) -> None:
    run_id = running(cluster, "resent")
    report(cluster, run_id, range(1, 11))
    report(cluster, run_id, range(1, 16))  # the retry: the lost one's rows, then newer ones
    assert stored_rows(run_id) == 15
    assert cluster.run(run_id).last_step == 15
    report(cluster, run_id, range(1, 11))  # the first copy, arriving last
    assert stored_rows(run_id) == 15
    run = cluster.run(run_id)
    assert run.last_step == 15 and run.last_loss == 10.0 / 15
