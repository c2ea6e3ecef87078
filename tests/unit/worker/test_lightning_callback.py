"""runyard_client.integrations.lightning.RunyardCallback in a real Lightning Trainer on CPU:
the tiny Llama of examples/lightning_train.py trains 8 steps in one process, its reports
landing in the standalone session's metrics file. It reports each step (or each logging
window) with its loss, learning rate and tokens, commits each .ckpt only once Lightning has
written it, turns SIGUSR2 into a save and `trainer.should_stop`, and a second `fit` handed
that checkpoint as `ckpt_path` goes on with the losses of a run that never stopped."""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch
from callback_helpers import CommitProbe, losses, rows, standalone, time_limit_signal
from lightning.pytorch import Callback, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning_train import TinyLlama
from runyard_client.integrations._common import CheckpointFolderError
from runyard_client.integrations.lightning import RunyardCallback, batch_tokens

STEPS, SAVE_STEPS, BATCH, SEQ_LEN = 8, 4, 4, 32


def written(path: Path, step: int) -> bool:
    """The file is there, loads, and is the checkpoint of `step`."""
    return path.is_file() and torch.load(path, weights_only=False)["global_step"] == step


class RecordingLlama(TinyLlama):
    """The example's module, noting each step's loss as training_step computed it."""

    def __init__(self) -> None:
        super().__init__(STEPS, SEQ_LEN, BATCH)
        self.step_losses: dict[int, float] = {}

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        self.step_losses[self.trainer.global_step + 1] = loss.item()
        return loss


class SignalAt(Callback):
    """Slurm's time-limit signal arrives during step `step` (before runyard's callback runs)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer: Trainer, *args: Any) -> None:
        if trainer.global_step == self.step:
            time_limit_signal()


def fit(
    *,
    before: tuple[Callback, ...] = (),
    probe: CommitProbe | None = None,
    dirpath: str | None = None,
    log_every_n_steps: int = 1,
) -> tuple[Trainer, RecordingLlama]:
    """One attempt, as examples/lightning_train.py runs it in one process, scaled down."""
    runyard = RunyardCallback()
    if probe is not None:
        probe.attach(runyard.session)
    module = RecordingLlama()
    module.data = module.data[:200_000]
    saves = ModelCheckpoint(dirpath=dirpath, every_n_train_steps=SAVE_STEPS, save_top_k=-1)
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=STEPS,
        log_every_n_steps=log_every_n_steps,
        callbacks=[*before, runyard, saves],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    trainer.fit(module, ckpt_path=runyard.ckpt_path())
    return trainer, module


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, RecordingLlama, CommitProbe]:
    """One uninterrupted run of 8 steps: its metrics file, its module, what it committed."""
    root = tmp_path_factory.mktemp("whole")
    probe = CommitProbe(written)
    with pytest.MonkeyPatch.context() as monkeypatch:
        metrics = standalone(monkeypatch, root)
        _, module = fit(probe=probe)
    return metrics, module, probe


def test_every_step_is_reported_with_its_loss_lr_and_tokens(whole: Any) -> None:
    metrics, module, _ = whole
    reported = rows(metrics, "metric")
    assert [row["step"] for row in reported] == list(range(1, STEPS + 1))
    for row in reported:
        assert row["loss"] == pytest.approx(module.step_losses[row["step"]], rel=1e-6)
        # Tokens per step: the batch the model saw, 4 sequences of 32 bytes.
        assert row["tokens_per_s"] * row["step_time_s"] == pytest.approx(BATCH * SEQ_LEN)
        # The rate the step used: the example's cosine from 3e-3 (no warm-up in 8 steps).
        cosine = 0.5 * (1 + math.cos(math.pi * (row["step"] - 1) / STEPS))
        assert row["lr"] == pytest.approx(3e-3 * cosine, rel=1e-6)
    assert rows(metrics, "finish") == [
        {"kind": "finish", "final_step": STEPS, "final_checkpoint_step": STEPS}
    ]


def test_a_report_covers_the_steps_since_the_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """log_every_n_steps=3: reports at steps 3 and 6 and at the end, each with its steps'
    mean loss (the loss stays on the device between reports)."""
    metrics = standalone(monkeypatch, tmp_path)
    _, module = fit(log_every_n_steps=3)
    reported = rows(metrics, "metric")
    assert [row["step"] for row in reported] == [3, 6, 8]
    windows = [range(1, 4), range(4, 7), range(7, 9)]
    for row, window in zip(reported, windows, strict=True):
        mean = statistics.fmean(module.step_losses[s] for s in window)
        assert row["loss"] == pytest.approx(mean, rel=1e-6)
        assert row["tokens_per_s"] * row["step_time_s"] == pytest.approx(BATCH * SEQ_LEN)


def test_each_checkpoint_is_committed_only_once_written(whole: Any) -> None:
    metrics, _, probe = whole
    folder = (metrics.parent / "ckpt").resolve()
    assert [(step, path.parent) for step, path, _ in probe.seen] == [(4, folder), (8, folder)]
    assert all(complete for _, _, complete in probe.seen), probe.seen
    commits = rows(metrics, "checkpoint")
    assert [(c["step"], c["state"]) for c in commits] == [(4, "COMMITTED"), (8, "COMMITTED")]
    assert [c["num_bytes"] for c in commits] == [p.stat().st_size for _, p, _ in probe.seen]


def test_a_stop_saves_a_checkpoint_and_the_resume_trains_the_same_steps(
    whole: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGUSR2 during step 3: stop-step=3.ckpt is saved in the run's folder and committed,
    fit ends at step 3, the run is not reported finished; a second fit handed it as
    ckpt_path trains steps 4 to 8 with the uninterrupted run's losses. Tolerance 1e-6
    relative: the checkpoint restores the fp32 weights, AdamW's moments and the schedule
    exactly, the example's batches are a function of the step, and the kernels are
    deterministic on one CPU thread, so the same arithmetic repeats (bit for bit here);
    the margin is for a kernel summing in another order."""
    probe = CommitProbe(written)
    metrics = standalone(monkeypatch, tmp_path)
    trainer, _ = fit(before=(SignalAt(3),), probe=probe)
    assert trainer.global_step == 3
    (step, path, complete), = probe.seen  # fmt: skip
    assert (step, path.name, complete) == (3, "stop-step=3.ckpt", True)
    assert rows(metrics, "finish") == []  # stopped, not done: the run resumes
    assert sorted(losses(metrics)) == [1, 2, 3]

    metrics = standalone(monkeypatch, tmp_path, attempt=2, resume=(step, str(path)))
    resumed, _ = fit()
    assert resumed.global_step == STEPS
    again, uninterrupted = losses(metrics), losses(whole[0])
    assert sorted(again) == [4, 5, 6, 7, 8]  # the global step went on from the checkpoint's
    for s, loss in again.items():
        assert loss == pytest.approx(uninterrupted[s], rel=1e-6), s


def test_a_checkpoint_folder_outside_the_runs_is_refused_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = standalone(monkeypatch, tmp_path)
    with pytest.raises(CheckpointFolderError, match=r"dirpath is .*elsewhere, outside"):
        fit(dirpath=str(tmp_path / "elsewhere"))
    assert not metrics.exists() or rows(metrics, "metric") == []


def test_tokens_are_read_from_the_batchs_shape() -> None:
    ids = torch.zeros(4, 32, dtype=torch.long)
    assert batch_tokens(ids) == 128
    assert batch_tokens({"attention_mask": torch.ones(4, 32), "input_ids": ids}) == 128
    assert batch_tokens((torch.randn(4, 3), ids[:, :10])) == 40  # the first integer tensor
    assert batch_tokens([torch.randn(2, 2)]) == 0
