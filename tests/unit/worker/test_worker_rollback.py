"""Loss spikes and non-finite values (issue 15), on the single-process worker.

Run A has NaN injected into its loss at step 13 (RUNYARD_FAULT nan_at_step): the loop finds
it at the report that closes step 13's window, saves nothing after it, reports the anomaly
and raises. The service's rollback (service/runs/rollback.py skip_for) resumes from the
newest committed checkpoint before it (step 10) with the data of steps 11-15 skipped; that
attempt finishes, and its losses are those of run R, which was given the same skip from the
start and never saw the window.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from worker_helpers import FakeService, tiny_spec

from contract import WorkerRunConfig
from contract.run_config import DataSkip, SpikeRule, data_step
from service.runs.rollback import skip_for
from service.worker_protocol.schemas import ErrorReport
from worker.anomaly import SpikeDetector, TrainingAnomalyError
from worker.checkpoint import latest_committed
from worker.launch import read_launch_env
from worker.reporter import FileReporter, HttpReporter
from worker.step import StepFigures
from worker.train import train


def rows(metrics: Path, kind: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [row for row in lines if row["kind"] == kind]


def losses(metrics: Path) -> dict[int, float]:
    return {row["step"]: row["loss"] for row in rows(metrics, "metric")}


@pytest.mark.timeout(240)
def test_nan_rolls_back_skips_the_window_and_matches_a_run_that_never_saw_it(
    tmp_path: Path, data_cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    spec = tiny_spec(tmp_path / "a", data_cache_dir, steps=20, checkpoint_every=5)
    spec["keep_checkpoints"] = 5
    monkeypatch.setenv("RUNYARD_FAULT", "nan_at_step:13:*:1")  # the first attempt only
    metrics_a = tmp_path / "a.jsonl"
    with pytest.raises(TrainingAnomalyError) as raised:
        train(WorkerRunConfig.model_validate(spec), read_launch_env({}), FileReporter(metrics_a))
    anomaly = raised.value.anomaly
    assert (anomaly.step, anomaly.kind, anomaly.figure) == (13, "non_finite", "loss")
    [reported] = rows(metrics_a, "anomaly")
    assert reported["step"] == 13 and reported["anomaly"] == "non_finite"
    seen = losses(metrics_a)
    # Step 13's NaN has no metric row (JSON has no NaN): the anomaly report names it.
    assert 13 not in seen
    assert all(math.isfinite(seen[s]) for s in range(1, 13))
    # Nothing saved after the anomaly: step 15 was due but its window closed first.
    resume = latest_committed(tmp_path / "a")
    assert resume is not None and resume.step == 10

    rule = SpikeRule()  # skip_before 2, skip_after 2
    skip = skip_for(anomaly.step, resume.step, rule)
    assert skip == DataSkip(from_step=11, steps=5)  # steps 11-15: never before the resume
    assert [data_step(s, [skip]) for s in (10, 11, 20)] == [10, 16, 25]

    # B: the service's next attempt, resuming from step 10 with the window skipped.
    resumed = WorkerRunConfig.model_validate(
        spec
        | {
            "attempt_number": 2,
            "resume_from": {"step": resume.step, "path": resume.path},
            "data_skips": [skip.model_dump()],
        }
    )
    metrics_b = tmp_path / "b.jsonl"
    result = train(resumed, read_launch_env({}), FileReporter(metrics_b))
    assert result.final_step == 20 and not result.stopped_early
    after = losses(metrics_b)
    assert sorted(after) == list(range(11, 21))

    # R: the same skip from the start, no fault: a run that never saw steps 11-15's data.
    monkeypatch.delenv("RUNYARD_FAULT")
    reference = WorkerRunConfig.model_validate(
        spec | {"checkpoint_dir": str(tmp_path / "r"), "data_skips": [skip.model_dump()]}
    )
    metrics_r = tmp_path / "r.jsonl"
    train(reference, read_launch_env({}), FileReporter(metrics_r))
    expected = losses(metrics_r)
    for step in range(1, 11):  # before the window: A and R trained alike
        assert seen[step] == pytest.approx(expected[step], abs=1e-5), step
    for step in range(11, 21):
        assert after[step] == pytest.approx(expected[step], abs=1e-5), step
    # The window was skipped indeed: A's own (unskipped) steps 11 and 12 differ.
    assert seen[11] != pytest.approx(after[11], abs=1e-4)


def figures(step: int, loss: float, grad_norm: float = 1.0) -> StepFigures:
    return StepFigures(step, loss, grad_norm, 1e-3)


def test_spike_rule_needs_history_and_both_thresholds() -> None:
    rule = SpikeRule(min_history=5, window=10, z=6.0, ratio=1.5, figures=["loss", "grad_norm"])
    detector = SpikeDetector(rule, warmup_steps=2)
    # In the warm-up nothing is judged a spike (but non-finite always is).
    assert detector.judge(figures(1, 50.0)) is None
    nan = detector.judge(figures(2, 3.0, float("inf")))
    assert nan is not None and (nan.kind, nan.figure) == ("non_finite", "grad_norm")
    detector = SpikeDetector(rule, warmup_steps=0)
    for step in range(1, 5):
        assert detector.judge(figures(step, 3.0 + 0.01 * step)) is None
    assert detector.judge(figures(5, 30.0)) is None  # four values before it: no verdict
    detector = SpikeDetector(rule, warmup_steps=0)
    for step in range(1, 11):
        assert detector.judge(figures(step, 3.0 + 0.01 * (step % 2))) is None
    # Far above mean + 6 std but under 1.5 x mean: not a spike.
    assert detector.judge(figures(11, 4.0)) is None
    spike = detector.judge(figures(12, 6.0))
    assert spike is not None and (spike.kind, spike.figure, spike.step) == ("spike", "loss", 12)
    assert spike.threshold is not None and 4.5 < spike.threshold < 6.0
    # A spike is not added to the history: the same value is judged a spike again.
    assert detector.judge(figures(13, 6.0)) is not None
    # The gradient norm is judged the same way.
    grad = detector.judge(figures(14, 3.0, 10.0))
    assert grad is not None and grad.figure == "grad_norm"
    # By default only the loss is judged for spikes.
    loss_only = SpikeDetector(SpikeRule(min_history=5), warmup_steps=0)
    for step in range(1, 11):
        assert loss_only.judge(figures(step, 3.0)) is None
    assert loss_only.judge(figures(11, 3.0, 100.0)) is None


def test_rank_0_reports_the_anomaly_as_the_service_reads_it(fake_service: FakeService) -> None:
    """HttpReporter.anomaly: the steps before it first, then an ErrorReport the service's
    schema accepts, kind worker:anomaly with the anomaly's own step (service/runs/rollback)."""
    reporter = HttpReporter(fake_service.url, 7, node="gpu001", interval_s=60.0)
    reporter.metric(12, loss=3.0, tokens_per_s=1.0, step_time_s=0.1)
    reporter.anomaly(13, "non_finite", "loss", "non-finite loss (nan) at step 13")
    reporter.close()
    # Only the worker's own requests: a health agent left by another test may heartbeat to
    # a port this fake service reused.
    paths = [path for path, _, _ in fake_service.received if path.startswith("/v1/worker/")]
    assert paths == ["/v1/worker/attempts/7/progress", "/v1/worker/attempts/7/errors"]
    [body] = fake_service.bodies("/errors")
    report = ErrorReport.model_validate(body)
    assert (report.kind, report.step, report.rank, report.node) == (
        "worker:anomaly",
        13,
        0,
        "gpu001",
    )
    assert "non-finite loss (nan) at step 13" in report.message
