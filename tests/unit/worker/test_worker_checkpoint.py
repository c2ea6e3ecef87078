"""Commit markers, latest_committed, prune, and a real DCP round trip in a one-rank world."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from worker_helpers import TINY_MODEL

from contract import ModelShape
from worker import checkpoint
from worker.distributed import init_distributed, shutdown_distributed
from worker.errors import CheckpointNotCommittedError
from worker.launch import read_launch_env
from worker.model import build_model


def make_folder(root: Path, step: int, committed: bool) -> Path:
    folder = checkpoint.step_folder(root, step)
    folder.mkdir(parents=True)
    (folder / "__0_0.distcp").write_bytes(b"x" * 10)
    if committed:
        (folder / checkpoint.MARKER).write_text(json.dumps({"step": step}))
    return folder


def test_latest_committed_skips_folders_without_the_marker(tmp_path: Path) -> None:
    assert checkpoint.latest_committed(tmp_path / "missing") is None
    make_folder(tmp_path, 5, committed=True)
    make_folder(tmp_path, 10, committed=True)
    make_folder(tmp_path, 15, committed=False)  # a save that died half-way
    (tmp_path / "step_junk").mkdir()
    latest = checkpoint.latest_committed(tmp_path)
    assert latest is not None
    assert latest.step == 10
    assert latest.path == str((tmp_path / "step_00000010").resolve())


def test_prune_keeps_the_newest_k_and_drops_failed_saves_behind_them(tmp_path: Path) -> None:
    for step in (5, 10, 20, 25):
        make_folder(tmp_path, step, committed=True)
    make_folder(tmp_path, 15, committed=False)  # older than a commit: garbage
    make_folder(tmp_path, 30, committed=False)  # newer than every commit: maybe being written
    removed = checkpoint.prune(tmp_path, keep=2)
    assert [p.name for p in removed] == ["step_00000005", "step_00000010", "step_00000015"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "step_00000020",
        "step_00000025",
        "step_00000030",
    ]
    assert checkpoint.prune(tmp_path, keep=2) == []


def test_an_attempt_resuming_below_committed_folders_discards_them_before_pruning(
    tmp_path: Path,
) -> None:
    """After a rollback past silent data corruption the service trusts nothing above the
    resume point (here: from scratch), but the folders it distrusts still carry COMMITTED
    markers. Left there, prune would count them as the newest three and delete the new
    attempt's first commit, the one the service would resume from."""
    for step in (70, 80, 90):
        make_folder(tmp_path, step, committed=True)
    make_folder(tmp_path, 95, committed=False)  # a save that died: no marker, left alone
    discarded = checkpoint.discard_abandoned(tmp_path, resume_step=0)
    assert [p.name for p in discarded] == ["step_00000070", "step_00000080", "step_00000090"]
    make_folder(tmp_path, 10, committed=True)  # the new attempt's first commit
    assert checkpoint.prune(tmp_path, keep=3) == []
    assert checkpoint.latest_committed(tmp_path).step == 10  # type: ignore[union-attr]


def test_discarding_keeps_the_resume_point_and_everything_below_it(tmp_path: Path) -> None:
    for step in (10, 20, 30):
        make_folder(tmp_path, step, committed=True)
    assert [p.name for p in checkpoint.discard_abandoned(tmp_path, resume_step=20)] == [
        "step_00000030"
    ]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step_00000010", "step_00000020"]
    assert checkpoint.discard_abandoned(tmp_path, resume_step=20) == []


def test_prune_without_any_commit_deletes_nothing(tmp_path: Path) -> None:
    make_folder(tmp_path, 5, committed=False)
    assert checkpoint.prune(tmp_path, keep=1) == []
    assert (tmp_path / "step_00000005").exists()


@pytest.fixture
def one_rank_world() -> Iterator[None]:
    init_distributed(read_launch_env({}), torch.device("cpu"))
    yield
    shutdown_distributed()


def test_save_commit_and_load_restore_everything(tmp_path: Path, one_rank_world: None) -> None:
    model = build_model(
        ModelShape(**TINY_MODEL), seed=0, device=torch.device("cpu"), max_seq_len=16
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randint(0, 256, (2, 16))).sum().backward()
    optimizer.step()
    trainer = checkpoint.TrainerState(step=7, data_step=7, consumed_tokens=7 * 128)
    state = checkpoint.training_state([model], [optimizer], trainer, rank=0)
    torch.manual_seed(99)
    saved = checkpoint.save(tmp_path, 7, state)
    expected_draw = torch.rand(3)

    marker = json.loads((saved.path / checkpoint.MARKER).read_text())
    assert (marker["step"], marker["world_size"]) == (7, 1)
    assert saved.num_bytes == sum(p.stat().st_size for p in saved.path.iterdir())
    assert saved.num_bytes > 3 * ModelShape(**TINY_MODEL).num_params * 4  # weights + 2 Adam moments

    # A fresh model, optimizer and counters, loaded from disk, equal the saved ones.
    fresh = build_model(
        ModelShape(**TINY_MODEL), seed=1, device=torch.device("cpu"), max_seq_len=16
    )
    fresh_optimizer = torch.optim.AdamW(fresh.parameters(), lr=1e-3)
    fresh_trainer = checkpoint.TrainerState()
    checkpoint.load(
        saved.path, checkpoint.training_state([fresh], [fresh_optimizer], fresh_trainer, 0)
    )
    for (name, a), b in zip(model.state_dict().items(), fresh.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    exp_avg = optimizer.state[model.output.weight]["exp_avg"]
    torch.testing.assert_close(fresh_optimizer.state[fresh.output.weight]["exp_avg"], exp_avg)
    assert fresh_trainer == trainer
    assert torch.equal(torch.rand(3), expected_draw)  # the RNG stream continues where it was


def test_load_refuses_an_uncommitted_folder(tmp_path: Path) -> None:
    folder = make_folder(tmp_path, 5, committed=False)
    with pytest.raises(CheckpointNotCommittedError, match="COMMITTED"):
        checkpoint.load(folder, {})


def test_async_saves_reuse_the_host_copy_yet_each_holds_its_own_values(
    tmp_path: Path, one_rank_world: None
) -> None:
    """The AsyncCheckpointer copies into the same host buffers at every save, in a thread:
    a second save must write the weights of its own step, the first keep those of its
    step, and neither see the changes made once the copy was waited for."""
    model = build_model(
        ModelShape(**TINY_MODEL), seed=0, device=torch.device("cpu"), max_seq_len=16
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    trainer = checkpoint.TrainerState()
    state = checkpoint.training_state([model], [optimizer], trainer, rank=0)
    saver = checkpoint.AsyncCheckpointer(tmp_path, state)
    weights = {}
    for step in (1, 2):
        model(torch.randint(0, 256, (2, 16))).sum().backward()
        optimizer.step()  # new weights (and moments) for this step
        optimizer.zero_grad()
        trainer.step = step
        weights[step] = model.output.weight.detach().clone()
        saver.save(step)
        saver.wait_for_staging()  # what the next step does before its update
        model.output.weight.data.add_(1.0)  # training goes on while the files are written
        assert saver.wait() is not None
    assert not torch.equal(weights[1], weights[2])
    for step in (1, 2):
        fresh = build_model(
            ModelShape(**TINY_MODEL), seed=1, device=torch.device("cpu"), max_seq_len=16
        )
        fresh_trainer = checkpoint.TrainerState()
        fresh_state = checkpoint.training_state(
            [fresh], [torch.optim.AdamW(fresh.parameters(), lr=1e-3)], fresh_trainer, 0
        )
        checkpoint.load(checkpoint.step_folder(tmp_path, step), fresh_state)
        assert fresh_trainer.step == step
        assert torch.equal(fresh.output.weight, weights[step]), step
    saver.close()
