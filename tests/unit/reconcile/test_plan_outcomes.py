"""Predicted against measured for every run, and the calibration later plans take from it:
the real, migrated Postgres and the service's own functions (the worker's reports go
through workers.record_progress as its endpoint calls it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db import session_scope
from service.models import PlanOutcome
from service.plans.accuracy import accuracy_report
from service.plans.history import cluster_calibration
from service.runs.plan_outcomes import WARMUP_STEPS
from service.slurm.fake import FakeSlurm
from service.worker_protocol.schemas import FinishReport, ProgressReport
from service.workers import service as workers
from tests.unit.reconcile.conftest import PREFIX, Cluster
from tests.unit.reconcile.test_checkpoint_trust import live_attempt_id, running


def outcome(run_id: int) -> PlanOutcome:
    with session_scope() as session:
        row = session.get(PlanOutcome, run_id)
        assert row is not None
        return row


def train(cluster: Cluster, run_id: int, step_times_s: list[float], finish: bool = False) -> None:
    """Rank 0 reports one row per step with these step times, then (optionally) the end."""
    rows = [{"step": s, "loss": 1.0, "step_time_s": t} for s, t in enumerate(step_times_s, start=1)]
    attempt_id = live_attempt_id(cluster, run_id)
    with session_scope() as session:
        workers.record_progress(session, attempt_id, ProgressReport(rank=0, metrics=rows))
        if finish:
            workers.record_finish(session, attempt_id, FinishReport(final_step=len(rows)))


def test_a_run_stores_its_plan_and_its_steady_state_measurement(cluster: Cluster) -> None:
    run_id = running(cluster, "measured", steps=10, checkpoint_every=10)
    stored = outcome(run_id)
    plan = cluster.run(run_id).config["plan"]
    assert stored.predicted_step_s == plan["step_time_s"]
    assert stored.layout_family == "ddp" and stored.accelerator == "cpu"
    assert stored.measured_step_s is None
    # The warm-up steps (building communicators) are slow; a checkpoint's step is slower.
    times = [5.0] * WARMUP_STEPS + [0.2, 0.2, 0.21, 0.19, 3.0, 0.2, 0.2, 0.2]
    train(cluster, run_id, times, finish=True)
    stored = outcome(run_id)
    assert stored.measured_step_s == pytest.approx(0.2)
    assert stored.num_measured_steps == len(times) - WARMUP_STEPS
    assert stored.measured_tokens_per_s_per_gpu == pytest.approx(8 * 128 / (0.2 * 2))
    assert stored.measured_mfu == pytest.approx(
        stored.predicted_mfu * stored.predicted_step_s / 0.2
    )
    with session_scope() as session:
        report = accuracy_report(session, cluster.settings, team=None, limit=10)
    (row,) = [r for r in report.runs if r.run_id == run_id]
    assert row.predicted_step_s == stored.predicted_step_s and row.measured_step_s == 0.2
    assert row.step_error == pytest.approx(stored.predicted_step_s / 0.2 - 1)
    assert not row.comparable  # the dev cluster trains on CPUs: no calibration from it
    (group,) = [g for g in report.groups if g.layout_family == "ddp"]
    assert group.num_runs == 1 and group.worst_step_error == row.step_error


@pytest.fixture
def gpu_cluster(db: sessionmaker[Session], tmp_path: Path) -> Cluster:
    """The same fake cluster, its workers said to train on the GPUs the plans cost."""
    settings = Settings(state_dir=tmp_path, job_prefix=PREFIX, accelerator="gpu",
                        run_reconciler=False)  # fmt: skip
    slurm = FakeSlurm.cluster(num_switches=2, nodes_per_switch=3, num_gpus=1, prefix="unit")
    gpu = Cluster(settings, slurm)
    gpu.set_spares(0)
    return gpu


def test_plans_calibrate_from_three_measured_runs_and_say_so(gpu_cluster: Cluster) -> None:
    """A site where every run steps at 1.5x the published figures: after three measured
    runs a new run's plan is 1.5x slower and says it calibrated from them; one asked to be
    uncalibrated is not."""
    for number in range(3):
        run_id = running(gpu_cluster, f"history-{number}", steps=10, checkpoint_every=10)
        measured = 1.5 * outcome(run_id).predicted_step_s
        train(gpu_cluster, run_id, [measured] * 10, finish=True)
        gpu_cluster.slurm.finish(gpu_cluster.live_job(run_id))
        gpu_cluster.cycle()
    with session_scope() as session:
        calibration = cluster_calibration(session, gpu_cluster.settings)
    assert calibration.num_runs == 3 and not calibration.per_term
    assert calibration.scale.compute == pytest.approx(1.5)

    new = gpu_cluster.submit_run("calibrated", steps=10, checkpoint_every=10)
    plan = gpu_cluster.run(new).config["plan"]
    assert plan["calibration"]["applied"] and plan["calibration"]["num_runs"] == 3
    assert plan["step_time_s"] == pytest.approx(1.5 * plan["uncalibrated_step_time_s"])
    assert "from 3 runs" in plan["calibration"]["summary"]
    assert outcome(new).calibrated and outcome(new).calibration_runs == 3

    plain = gpu_cluster.submit_run("uncalibrated", steps=10, checkpoint_every=10, uncalibrated=True)
    plan = gpu_cluster.run(plain).config["plan"]
    assert plan["calibration"] is None
    assert plan["step_time_s"] == pytest.approx(plan["uncalibrated_step_time_s"])
