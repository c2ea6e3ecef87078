"""The training loop in one process: the LR schedule, learning, refusals with exit code 3."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml
from worker_helpers import tiny_spec

from contract import ExitCode, WorkerRunConfig
from worker.launch import read_launch_env
from worker.reporter import FileReporter
from worker.train import lr_at, main, train


def read_metrics(path: Path, kind: str = "metric") -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return [row for row in rows if row["kind"] == kind]


def test_lr_warms_up_then_decays_by_cosine(tmp_path: Path) -> None:
    config = WorkerRunConfig.model_validate(
        tiny_spec(tmp_path, tmp_path, steps=110, warmup_steps=10, lr=1.0)
    )
    assert lr_at(1, config) == pytest.approx(0.1)
    assert lr_at(10, config) == pytest.approx(1.0)
    assert lr_at(60, config) == pytest.approx(0.55)  # half way: midpoint of 1.0 and 0.1
    assert lr_at(110, config) == pytest.approx(0.1)
    no_warmup = config.model_copy(update={"warmup_steps": 0})
    assert lr_at(1, no_warmup) == pytest.approx(1.0, abs=1e-3)


def test_loss_falls_on_real_text(tmp_path: Path, data_cache_dir: Path, capsys) -> None:
    spec = tiny_spec(tmp_path / "ckpt", data_cache_dir, steps=60, checkpoint_every=1000)
    metrics = tmp_path / "metrics.jsonl"
    result = train(WorkerRunConfig.model_validate(spec), read_launch_env({}), FileReporter(metrics))
    losses = [row["loss"] for row in read_metrics(metrics)]
    assert len(losses) == 60 and (result.final_step, result.final_checkpoint_step) == (60, 60)
    assert losses[0] > 5.3  # ln(256) = 5.55: uniform over bytes
    assert sum(losses[-10:]) / 10 < 3.3
    assert "step 60/60 loss" in capsys.readouterr().out
    assert read_metrics(metrics, "finish") == [
        {"kind": "finish", "final_step": 60, "final_checkpoint_step": 60}
    ]
    states = [(row["step"], row["state"]) for row in read_metrics(metrics, "checkpoint")]
    assert states == [(60, "WRITING"), (60, "COMMITTED")]  # always a checkpoint at the end


def write_spec(tmp_path: Path, spec: dict) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


@pytest.mark.parametrize(
    ("layout", "message"),
    [
        ({"dp": 1, "tp": 2}, "dp 1 x tp 2 x pp 1 x cp 1 = 2 ranks, but 1 were launched"),
        ({"tp": 4}, "layout.tp: tp (4) must divide the model's kv_heads (2)"),
        ({"pp": 3}, "layout.pp: pp x vp (3) exceeds the model's 2 layers"),
        ({"precision": "fp8"}, "precision=fp8 needs an NVIDIA GPU"),
    ],
)
def test_a_layout_that_cannot_run_exits_do_not_retry(
    tmp_path: Path, capsys, layout: dict, message: str
) -> None:
    spec = tiny_spec(tmp_path / "ckpt", tmp_path, layout=layout)
    assert main(["--spec", str(write_spec(tmp_path, spec))]) == ExitCode.DO_NOT_RETRY == 3
    assert message in capsys.readouterr().err


def test_invalid_spec_exits_do_not_retry_naming_the_field(tmp_path: Path, capsys) -> None:
    spec = tiny_spec(
        tmp_path / "ckpt", tmp_path, global_batch=7, layout={"dp": 1, "micro_batch_size": 2}
    )
    assert main(["--spec", str(write_spec(tmp_path, spec))]) == ExitCode.DO_NOT_RETRY
    assert "global_batch (7) must be divisible" in capsys.readouterr().err


def test_resume_from_an_uncommitted_folder_exits_do_not_retry(
    tmp_path: Path, data_cache_dir: Path, capsys
) -> None:
    half_written = tmp_path / "ckpt" / "step_00000005"
    half_written.mkdir(parents=True)
    spec = tiny_spec(
        tmp_path / "ckpt", data_cache_dir, resume_from={"step": 5, "path": str(half_written)}
    )
    assert main(["--spec", str(write_spec(tmp_path, spec))]) == ExitCode.DO_NOT_RETRY
    assert "has no COMMITTED marker" in capsys.readouterr().err


def test_missing_spec_file_exits_do_not_retry(tmp_path: Path, capsys) -> None:
    assert main(["--spec", str(tmp_path / "missing.yaml")]) == ExitCode.DO_NOT_RETRY
    assert "cannot read spec" in capsys.readouterr().err


class ActAfterStep(FileReporter):
    """Records like FileReporter, and does `action` once step `at` was reported."""

    def __init__(self, path: Path, at: int, action: Callable[[FileReporter], None]) -> None:
        super().__init__(path)
        self.at, self.action = at, action

    def metric(
        self,
        step: int,
        loss: float,
        tokens_per_s: float,
        step_time_s: float,
        lr: float | None = None,
    ) -> None:
        super().metric(step, loss, tokens_per_s, step_time_s, lr)
        if step == self.at:
            self.action(self)


def cancel(reporter: FileReporter) -> None:
    reporter.cancel_requested = True  # what HttpReporter sets on run_state CANCELLING


def time_limit_signal(reporter: FileReporter) -> None:
    os.kill(os.getpid(), signal.SIGUSR2)  # what Slurm sends ahead of the time limit


@pytest.mark.parametrize("action", [cancel, time_limit_signal])
def test_a_stop_request_ends_with_a_checkpoint_and_no_finish(
    tmp_path: Path, data_cache_dir: Path, action: Callable[[FileReporter], None]
) -> None:
    # A stop is seen at the next report; a report interval far below a step's time makes
    # every step a report.
    spec = tiny_spec(tmp_path / "ckpt", data_cache_dir, report_interval_s=1e-3)
    config = WorkerRunConfig.model_validate(spec)
    metrics = tmp_path / "metrics.jsonl"
    before = signal.getsignal(signal.SIGUSR2)  # SIG_DFL, unless an earlier test left one
    result = train(config, read_launch_env({}), ActAfterStep(metrics, at=2, action=action))
    # Seen by the loop at the next step's report: step 3 is the last.
    assert (result.final_step, result.final_checkpoint_step, result.stopped_early) == (3, 3, True)
    assert [row["step"] for row in read_metrics(metrics)] == [1, 2, 3]
    assert (tmp_path / "ckpt" / "step_00000003" / "COMMITTED").exists()
    assert read_metrics(metrics, "finish") == []
    assert signal.getsignal(signal.SIGUSR2) == before  # the loop's handler removed again
