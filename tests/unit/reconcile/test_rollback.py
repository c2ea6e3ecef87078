"""Loss spikes and non-finite values, decided against the fake Slurm (issue 15).

The worker reports the anomaly (`worker:anomaly` with its step) and exits 1; the service
rolls the run back to the newest committed checkpoint with a window of data skipped (on
the run, passed to every later attempt's config), costs no restart, and shows it on the
timeline, in goodput and in `run show`'s rollbacks. Anomalies at the same place again stop
the run with REPEATED_ANOMALY instead of looping."""

from __future__ import annotations

from contract import StopReason
from contract.run_config import DataSkip
from service.db import session_scope
from service.models import RunState
from service.runs import repository
from service.runs.service import run_goodput, run_out, worker_config
from service.worker_protocol.schemas import ErrorReport
from service.workers import service as workers
from tests.unit.reconcile.conftest import Cluster
from tests.unit.reconcile.test_checkpoint_trust import (
    fail_job,
    live_attempt_id,
    report_exception,
    running,
)


def report_anomaly(cluster: Cluster, run_id: int, step: int) -> None:
    """What rank 0's HttpReporter.anomaly posts before every rank raises."""
    message = f"non_finite loss: non-finite loss (nan) at step {step}"
    report = ErrorReport(rank=0, kind="worker:anomaly", message=message, step=step)
    with session_scope() as session:
        workers.record_error(session, live_attempt_id(cluster, run_id), report)


def config_of_live_attempt(cluster: Cluster, run_id: int) -> tuple[int | None, list[DataSkip]]:
    with session_scope() as session:
        run = repository.get_run(session, run_id)
        assert run is not None
        attempt = repository.live_attempt(run)
        assert attempt is not None
        config = worker_config(session, run, attempt, cluster.settings)
        resume = config.resume_from.step if config.resume_from else None
        return resume, list(config.data_skips)


def test_a_nan_rolls_back_past_the_window_without_a_restart(cluster: Cluster) -> None:
    run_id = running(cluster, "nan-rollback", max_restarts=0, keep_checkpoints=5)
    cluster.train(run_id, 20)
    cluster.train(run_id, 40)
    report_anomaly(cluster, run_id, 53)
    report_exception(cluster, run_id, 55, "TrainingAnomalyError: non-finite loss at step 53")
    fail_job(cluster, run_id)

    run = cluster.run(run_id)
    first, second = cluster.attempts(run_id)
    assert first.stop_reason == StopReason.ROLLED_BACK
    assert run.state == RunState.RUNNING and run.num_restarts == 0  # max_restarts 0 still fine
    assert second.resume_step == 40
    assert "rolled back to step 40" in (first.end_reason or "")
    assert "data of steps 51-55 skipped" in (first.end_reason or "")
    # The next attempt resumes from 40 and skips the data of steps 51-55 (skip 2 either side).
    resume, skips = config_of_live_attempt(cluster, run_id)
    assert resume == 40 and skips == [DataSkip(from_step=51, steps=5)]
    assert "run.rolled_back" in cluster.events(run_id)
    with session_scope() as session:
        run = repository.get_run(session, run_id)
        assert run is not None
        out = run_out(run, run_goodput(session, run))
    [row] = out.rollbacks
    assert (row["anomaly_step"], row["resume_step"], row["skip_from_step"]) == (53, 40, 51)
    assert out.goodput is not None and out.goodput.lost.recomputed_steps_s == 0.0

    # A spike far from the first: another rollback, both skips kept, in order.
    cluster.train(run_id, 60)
    cluster.train(run_id, 80)
    report_anomaly(cluster, run_id, 90)
    fail_job(cluster, run_id)
    resume, skips = config_of_live_attempt(cluster, run_id)
    assert resume == 80
    assert skips == [DataSkip(from_step=51, steps=5), DataSkip(from_step=88, steps=5)]
    assert cluster.run(run_id).num_restarts == 0


def test_anomalies_at_the_same_place_stop_the_run(cluster: Cluster) -> None:
    run_id = running(cluster, "nan-again", max_restarts=5)
    cluster.train(run_id, 20)
    for step in (33, 34):  # default max_rollbacks_at_step 2: two rollbacks near step 33
        report_anomaly(cluster, run_id, step)
        fail_job(cluster, run_id)
        assert cluster.run(run_id).state == RunState.RUNNING
    report_anomaly(cluster, run_id, 35)  # a third at the same place: skipping data did not help
    fail_job(cluster, run_id)
    run = cluster.run(run_id)
    last = cluster.attempts(run_id)[-1]
    assert run.state == RunState.FAILED and run.num_restarts == 0
    assert last.stop_reason == StopReason.REPEATED_ANOMALY
    assert "2 rollback(s) before (steps 33, 34)" in (run.state_reason or "")


def test_an_exception_without_an_anomaly_is_not_rolled_back(cluster: Cluster) -> None:
    run_id = running(cluster, "plain-crash", max_restarts=2)
    cluster.train(run_id, 20)
    report_exception(cluster, run_id, 25, "RuntimeError: boom")
    fail_job(cluster, run_id)
    first, _ = cluster.attempts(run_id)
    assert first.stop_reason == StopReason.JOB_FAILED and cluster.run(run_id).num_restarts == 1
    assert cluster.run(run_id).config.get("data_skips") is None
