"""Checkpoint checksums: recorded when written, verified at the commit and at the load; a
mismatch marks the folder CORRUPT, which nothing on disk then loads, resumes or keeps."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from worker_helpers import TINY_MODEL

from contract import ModelShape
from worker import checkpoint, faults
from worker.distributed import init_distributed, shutdown_distributed
from worker.launch import read_launch_env
from worker.model import build_model


@pytest.fixture
def one_rank_world() -> Iterator[None]:
    init_distributed(read_launch_env({}), torch.device("cpu"))
    yield
    shutdown_distributed()


def tiny_state() -> dict[str, checkpoint.Stateful]:
    model = build_model(
        ModelShape(**TINY_MODEL), seed=0, device=torch.device("cpu"), max_seq_len=16
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return checkpoint.training_state([model], [optimizer], checkpoint.TrainerState(), rank=0)


def test_a_save_records_every_file_and_its_checksum(tmp_path: Path, one_rank_world: None) -> None:
    saved = checkpoint.save(tmp_path, 5, tiny_state())
    assert saved.corrupt is None
    manifest = json.loads((saved.path / checkpoint.MANIFEST).read_text())
    data_files = sorted(p.name for p in saved.path.glob("*.distcp"))
    assert sorted(manifest["files"]) == sorted([*data_files, ".metadata"])
    assert (saved.path / "MANIFEST.rank0.json").is_file()  # the rank's own, merged above
    for name, recorded in manifest["files"].items():
        assert recorded == checkpoint.file_digest(saved.path / name)
    marker = json.loads((saved.path / checkpoint.MARKER).read_text())
    assert marker["checksums"] == "sha256"
    assert checkpoint.verify(saved.path) is None


def test_a_flipped_byte_fails_the_load_marks_the_folder_and_nothing_takes_it_again(
    tmp_path: Path, one_rank_world: None
) -> None:
    checkpoint.save(tmp_path, 5, tiny_state())
    newest = checkpoint.save(tmp_path, 10, tiny_state())
    flipped = faults.corrupt_one_byte(newest.path, rank=0)

    with pytest.raises(checkpoint.CheckpointCorruptError) as caught:
        checkpoint.load(newest.path, tiny_state())
    assert caught.value.step == 10 and flipped.name in caught.value.detail
    assert "sha256" in caught.value.detail

    assert (newest.path / checkpoint.CORRUPT_MARKER).is_file()
    assert not checkpoint.is_committed(newest.path)
    latest = checkpoint.latest_committed(tmp_path)
    assert latest is not None and latest.step == 5  # the one before is the newest now
    with pytest.raises(checkpoint.CheckpointCorruptError, match="marked CORRUPT before"):
        checkpoint.load(newest.path, tiny_state())  # never loaded again
    # Pruning keeps the previous good one: the corrupt folder does not count as kept.
    assert checkpoint.prune(tmp_path, keep=1) == []
    assert checkpoint.step_folder(tmp_path, 5).is_dir()


def test_a_truncated_or_missing_file_is_corrupt_too(tmp_path: Path, one_rank_world: None) -> None:
    saved = checkpoint.save(tmp_path, 5, tiny_state())
    data = next(saved.path.glob("*.distcp"))
    data.write_bytes(data.read_bytes()[:-10])
    assert "bytes" in (checkpoint.verify(saved.path) or "")
    data.unlink()
    assert "missing" in (checkpoint.verify(saved.path) or "")


def test_the_commit_refuses_files_corrupted_after_they_were_written(
    tmp_path: Path, one_rank_world: None
) -> None:
    """Asynchronous save: rank 0 verifies in its own thread before the marker; a mismatch
    writes CORRUPT instead of COMMITTED, and the save says why."""
    points = faults.fault_points("corrupt_before_commit:2", "tiny", 1)
    saver = checkpoint.AsyncCheckpointer(tmp_path, tiny_state(), fault_points=points)
    saver.save(1)
    good = saver.wait()
    saver.save(2)
    bad = saver.wait()
    saver.close()
    assert good is not None and good.corrupt is None
    assert bad is not None and bad.corrupt is not None and "sha256" in bad.corrupt
    assert not (bad.path / checkpoint.MARKER).exists()
    assert (bad.path / checkpoint.CORRUPT_MARKER).is_file()
    latest = checkpoint.latest_committed(tmp_path)
    assert latest is not None and latest.step == 1


def test_corrupt_after_commit_leaves_a_committed_checkpoint_only_a_load_refuses(
    tmp_path: Path, one_rank_world: None
) -> None:
    points = faults.fault_points("corrupt_after_commit:2", "tiny", 1)
    saver = checkpoint.AsyncCheckpointer(tmp_path, tiny_state(), fault_points=points)
    saver.save(1)
    good = saver.wait()
    saver.save(2)
    bad = saver.wait()
    saver.close()
    assert good is not None and bad is not None and bad.corrupt is None  # committed
    assert checkpoint.is_committed(bad.path) and checkpoint.verify(good.path) is None
    assert "sha256" in (checkpoint.verify(bad.path) or "")
    with pytest.raises(checkpoint.CheckpointCorruptError):
        checkpoint.load(bad.path, tiny_state())
    assert checkpoint.is_corrupt(bad.path)


def test_a_checkpoint_from_before_checksums_loads_unchecked(tmp_path: Path) -> None:
    folder = checkpoint.step_folder(tmp_path, 5)
    folder.mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(b"x" * 10)
    (folder / checkpoint.MARKER).write_text(json.dumps({"step": 5}))
    assert checkpoint.verify(folder) is None


def test_fault_specs_name_a_rank_an_attempt_and_a_run() -> None:
    spec = "after_step:5, raise_after_step:30:*, corrupt_after_commit:40:0:1@ck"
    parsed = faults.parse(spec)
    assert [(f.name, f.step, f.rank, f.attempt, f.run) for f in parsed] == [
        ("after_step", 5, 0, None, None),
        ("raise_after_step", 30, None, None, None),
        ("corrupt_after_commit", 40, 0, 1, "ck"),
    ]
    assert not parsed[2].names("ck", 2) and parsed[2].names("ck", 1)  # attempt 1 only
    assert not parsed[2].names("other", 1) and parsed[0].names("other", 7)
    attempt1 = faults.fault_points(spec, "ck", 1)
    attempt2 = faults.fault_points(spec, "ck", 2)
    assert isinstance(attempt1, faults.InjectedFaults)
    assert isinstance(attempt2, faults.InjectedFaults)
    assert attempt1.firing("after_commit", 40, 0) == [parsed[2]]
    assert attempt2.firing("after_commit", 40, 0) == []
    assert parsed[2].fires("after_commit", 40, 0) and not parsed[2].fires("after_commit", 40, 1)
    assert parsed[1].fires("after_step", 30, 3)
    with pytest.raises(ValueError, match="not one of"):
        faults.parse("explode:3")


class RecordingReporter:
    """What rank 0 tells the service about checkpoints, kept to be read back."""

    def __init__(self) -> None:
        self.reports: list[tuple[int, str, str]] = []

    def checkpoint(self, step: int, path: str, state: str, *_: object, **__: object) -> bool:
        self.reports.append((step, path, state))
        return True


def test_resuming_from_a_corrupt_checkpoint_reports_it_for_both_training_loops(
    tmp_path: Path, one_rank_world: None
) -> None:
    """worker.train.resume_from_checkpoint is what the plain and the replica-group loops
    both resume with: a checkpoint that fails its checksums is reported CORRUPT, so the
    service resumes the next attempt from the one before instead of failing again."""
    from contract import ResumePoint
    from worker.train import resume_from_checkpoint

    checkpoint.save(tmp_path, 5, tiny_state())
    newest = checkpoint.save(tmp_path, 10, tiny_state())
    faults.corrupt_one_byte(newest.path, rank=0)
    reporter = RecordingReporter()
    point = ResumePoint(step=10, path=str(newest.path))
    with pytest.raises(checkpoint.CheckpointCorruptError):
        resume_from_checkpoint(point, tiny_state(), reporter, is_rank0=True)  # type: ignore[arg-type]
    assert reporter.reports == [(10, str(newest.path), "CORRUPT")]
    state = tiny_state()
    resume_from_checkpoint(
        ResumePoint(step=5, path=str(tmp_path / "step_00000005")), state, reporter, is_rank0=True
    )  # type: ignore[arg-type]
    assert len(reporter.reports) == 1, "the good one before it loads, with nothing to report"
