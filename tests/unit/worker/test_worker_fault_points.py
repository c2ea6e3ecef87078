"""The training loop calls its fault points where their faults say (worker/fault_points.py),
one rank in this process or in a `python -m worker.train` of its own: a fault after a step
fails or kills the rank there, a paced step lasts its seconds, and the step a failure
escaped the loop at is noted on the exception (train._note_failed_step), whether it was
raised in the loop itself or in a component below it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from worker_helpers import clean_env, tiny_spec

from contract import WorkerRunConfig
from worker.anomaly import TrainingAnomalyError
from worker.faults import InjectedFault
from worker.launch import read_launch_env
from worker.reporter import FileReporter, Reporter
from worker.train import train

REPO_ROOT = Path(__file__).resolve().parents[3]


def metric_rows(metrics: Path) -> list[dict[str, Any]]:
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [row for row in rows if row["kind"] == "metric"]


@pytest.mark.timeout(120)
def test_a_failure_notes_the_step_it_escaped_the_loop_at(
    tmp_path: Path, data_cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # raise_after_step: raised by the loop's own call of a fault point.
    monkeypatch.setenv("RUNYARD_FAULT", "raise_after_step:3")
    spec = tiny_spec(tmp_path / "raise", data_cache_dir, steps=6)
    with pytest.raises(InjectedFault) as raised:
        train(WorkerRunConfig.model_validate(spec), read_launch_env({}), Reporter())
    assert raised.value.runyard_step == 3  # type: ignore[attr-defined]

    # nan_at_step: found by the anomaly check, two calls below the loop, at the report of
    # step 4 (a checkpoint step: it always reports).
    monkeypatch.setenv("RUNYARD_FAULT", "nan_at_step:4")
    spec = tiny_spec(tmp_path / "nan", data_cache_dir, steps=6, checkpoint_every=4)
    with pytest.raises(TrainingAnomalyError) as found:
        train(WorkerRunConfig.model_validate(spec), read_launch_env({}), Reporter())
    assert found.value.anomaly.step == 4
    assert found.value.runyard_step == 4  # type: ignore[attr-defined]


@pytest.mark.timeout(120)
def test_pace_step_is_the_floor_of_every_step_of_the_loop(
    tmp_path: Path, data_cache_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pace_s = 0.3  # the tiny model's own step takes a few tens of ms
    monkeypatch.setenv("RUNYARD_FAULT", f"pace_step:2:*={pace_s}")  # from step 2 on
    metrics = tmp_path / "metrics.jsonl"
    spec = tiny_spec(tmp_path / "ckpt", data_cache_dir, steps=5, report_interval_s=1e-3)
    train(WorkerRunConfig.model_validate(spec), read_launch_env({}), FileReporter(metrics))
    step_times = {row["step"]: row["step_time_s"] for row in metric_rows(metrics)}
    assert sorted(step_times) == [1, 2, 3, 4, 5]  # a report every step: its own time
    # A step's pace is slept at its very end, after its report, so the windows do not
    # split at steps' bounds; but steps 3 and 4 lie whole between step 2's report and step
    # 5's, the windows of steps 3 to 5.
    assert sum(step_times[step] for step in (3, 4, 5)) >= 2 * pace_s, step_times


@pytest.mark.timeout(120)
def test_after_step_kills_the_rank_at_its_step(tmp_path: Path, data_cache_dir: Path) -> None:
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(tiny_spec(tmp_path / "unused", data_cache_dir, steps=8)))
    metrics = tmp_path / "metrics.jsonl"
    rank = subprocess.run(
        [sys.executable, "-m", "worker.train", "--spec", str(spec),
         "--checkpoint-dir", str(tmp_path / "ckpt"), "--metrics-file", str(metrics)],
        env=clean_env(PYTHONPATH=str(REPO_ROOT), RUNYARD_FAULT="after_step:3"),
        capture_output=True, text=True, timeout=110,
    )  # fmt: skip
    assert rank.returncode == -9, rank.stdout[-3000:] + rank.stderr[-3000:]  # SIGKILL
    assert "killing rank 0 at after_step of step 3" in rank.stdout
    assert max(row["step"] for row in metric_rows(metrics)) <= 3  # nothing trained past it
