"""runyard_client.integrations.hf.RunyardCallback in a real transformers.Trainer on CPU: the
tiny Llama of examples/hf_trainer.py trains 8 steps in one process, its reports landing in
the standalone session's metrics file. It reports every logged step, commits each
checkpoint-N folder only once the Trainer has written it, turns SIGUSR2 into the Trainer's
own save-then-stop, and a second run handed that checkpoint goes on with the same losses
as a run that never stopped."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from callback_helpers import CommitProbe, losses, rows, standalone, time_limit_signal
from hf_trainer import ByteSequences, stdlib_bytes, tiny_llama, training_arguments
from runyard_client.integrations._common import CheckpointFolderError
from runyard_client.integrations.hf import RunyardCallback
from transformers import Trainer, TrainerCallback

STEPS, SAVE_STEPS, BATCH, SEQ_LEN = 8, 4, 4, 32
# What a Trainer checkpoint folder holds once written; trainer_state.json is what it resumes.
CHECKPOINT_FILES = ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state.pth",
                    "trainer_state.json")  # fmt: skip


def written(folder: Path, step: int) -> bool:
    if not all((folder / name).is_file() for name in CHECKPOINT_FILES):
        return False
    return json.loads((folder / "trainer_state.json").read_text())["global_step"] == step


class SignalAt(TrainerCallback):
    """Slurm's time-limit signal arrives during step `step` (before runyard's callback runs)."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            time_limit_signal()


def train(
    *, before: tuple[TrainerCallback, ...] = (), probe: CommitProbe | None = None, **args: Any
) -> tuple[Trainer, RunyardCallback]:
    """One attempt of the example's setup, scaled down; `args` override TrainingArguments."""
    runyard = RunyardCallback()
    if probe is not None:
        probe.attach(runyard.session)
    arguments = training_arguments(runyard.output_dir, STEPS, SAVE_STEPS, BATCH, lr=3e-3)
    for name, value in args.items():
        setattr(arguments, name, value)
    trainer = Trainer(
        model=tiny_llama(SEQ_LEN),
        args=arguments,
        train_dataset=ByteSequences(stdlib_bytes(num_modules=3), SEQ_LEN, num_sequences=256),
        callbacks=[*before, runyard],
    )
    trainer.train(resume_from_checkpoint=runyard.resume_from_checkpoint())
    return trainer, runyard


@pytest.fixture(scope="module")
def whole(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Trainer, CommitProbe]:
    """One uninterrupted run of 8 steps: its metrics file, its Trainer, what it committed."""
    root = tmp_path_factory.mktemp("whole")
    probe = CommitProbe(written)
    with pytest.MonkeyPatch.context() as monkeypatch:
        metrics = standalone(monkeypatch, root)
        trainer, _ = train(probe=probe)
    return metrics, trainer, probe


def test_every_logged_step_is_reported_with_its_loss_lr_and_tokens(whole: Any) -> None:
    metrics, trainer, _ = whole
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    reported = rows(metrics, "metric")
    assert [row["step"] for row in reported] == list(range(1, STEPS + 1))
    for row, entry in zip(reported, logged, strict=True):
        assert row["loss"] == pytest.approx(entry["loss"], rel=1e-6)  # the Trainer's own
        assert row["lr"] == pytest.approx(entry["learning_rate"], rel=1e-6)
        # Tokens per step: the batch the model saw, 4 sequences of 32 bytes.
        assert row["tokens_per_s"] * row["step_time_s"] == pytest.approx(BATCH * SEQ_LEN)
    assert rows(metrics, "finish") == [
        {"kind": "finish", "final_step": STEPS, "final_checkpoint_step": STEPS}
    ]


def test_tokens_come_from_the_trainers_count_where_it_keeps_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = standalone(monkeypatch, tmp_path)
    train(include_num_input_tokens_seen="all", max_steps=3, save_steps=10)
    for row in rows(metrics, "metric"):
        assert row["tokens_per_s"] * row["step_time_s"] == pytest.approx(BATCH * SEQ_LEN)


def test_each_checkpoint_is_committed_only_once_written(whole: Any) -> None:
    metrics, _, probe = whole
    folder = (metrics.parent / "ckpt").resolve()
    assert [(step, path) for step, path, _ in probe.seen] == [
        (4, folder / "checkpoint-4"),
        (8, folder / "checkpoint-8"),
    ]
    assert all(complete for _, _, complete in probe.seen), probe.seen
    commits = rows(metrics, "checkpoint")
    assert [(c["step"], c["state"]) for c in commits] == [(4, "COMMITTED"), (8, "COMMITTED")]
    assert all(c["num_bytes"] > 1_000_000 for c in commits)  # the folder's files, ~1.5 MB


def test_a_stop_saves_through_the_trainer_and_the_resume_trains_the_same_steps(
    whole: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """SIGUSR2 during step 3: the Trainer saves checkpoint-3 and stops there, the run is not
    reported finished; the next attempt, handed checkpoint-3, trains steps 4 to 8 with the
    losses of the run that never stopped. Tolerance 1e-6 relative: the checkpoint restores
    the fp32 weights, AdamW's moments, the schedule, the RNG and the data order exactly and
    the kernels are deterministic on one CPU thread, so the same arithmetic repeats (it
    matches bit for bit here); the margin is for a kernel summing in another order."""
    probe = CommitProbe(written)
    metrics = standalone(monkeypatch, tmp_path)
    trainer, _ = train(before=(SignalAt(3),), probe=probe)
    assert trainer.state.global_step == 3
    assert [(step, complete) for step, _, complete in probe.seen] == [(3, True)]
    assert rows(metrics, "finish") == []  # stopped, not done: the run resumes
    assert sorted(losses(metrics)) == [1, 2, 3]

    (step, path, _), = probe.seen  # fmt: skip
    metrics = standalone(monkeypatch, tmp_path, attempt=2, resume=(step, str(path)))
    resumed, _ = train()
    assert resumed.state.global_step == STEPS
    again, uninterrupted = losses(metrics), losses(whole[0])
    assert sorted(again) == [4, 5, 6, 7, 8]  # the global step went on from the checkpoint's
    for s, loss in again.items():
        assert loss == pytest.approx(uninterrupted[s], rel=1e-6), s


def test_a_checkpoint_folder_outside_the_runs_is_refused_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    metrics = standalone(monkeypatch, tmp_path)
    with pytest.raises(CheckpointFolderError, match=r"output_dir is .*elsewhere, outside"):
        train(output_dir=str(tmp_path / "elsewhere"))
    assert not metrics.exists() or rows(metrics, "metric") == []


def test_importing_the_client_or_the_integrations_package_imports_no_framework() -> None:
    """A script that uses neither framework pays for neither: only hf.py and lightning.py
    import theirs, when they are imported."""
    probe = (
        "import sys, runyard_client, runyard_client.integrations; "
        "print(sorted({m.split('.')[0] for m in sys.modules} "
        "& {'torch', 'transformers', 'lightning', 'accelerate'}))"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
