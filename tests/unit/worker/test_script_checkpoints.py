"""Checkpoints a script saves by itself, found in the run's folder by their own layout's
marker (torchtitan's DCP `step-N`, Hugging Face's `checkpoint-N`, Lightning's `.ckpt`, a
generic `step_N` with COMPLETE): complete ones are committed oldest first, incomplete ones,
links and what was there before the script started are not."""

from __future__ import annotations

import json
from pathlib import Path

from worker.reporter import FileReporter
from worker.script_checkpoints import CheckpointWatcher, Found, Layout, complete, found_in


def folder(root: Path, name: str, *files: str) -> Path:
    path = root / name
    path.mkdir()
    (path / "__0_0.distcp").write_bytes(b"x" * 100)
    for file in files:
        (path / file).write_text("{}")
    return path


def steps_of(found: list[Found]) -> list[tuple[int, Layout]]:
    return [(f.step, f.layout) for f in found]


def test_each_layout_is_complete_by_its_own_marker(tmp_path: Path) -> None:
    folder(tmp_path, "step-10", ".metadata")  # torchtitan: DCP's metadata, written last
    folder(tmp_path, "step-20")  # torchtitan, still writing
    folder(tmp_path, "checkpoint-30", "trainer_state.json")  # Hugging Face Trainer
    folder(tmp_path, "checkpoint-40", "model.safetensors")  # HF, trainer state not yet
    folder(tmp_path, "step_50", "COMPLETE")  # anyone's, with an explicit marker
    folder(tmp_path, "step_60", "partial")
    folder(tmp_path, "stepping-70", ".metadata")  # not a step folder's name
    (tmp_path / "epoch=0-step=80.ckpt").write_bytes(b"l" * 10)  # Lightning
    (tmp_path / "epoch=1-step=90.ckpt").write_bytes(b"l" * 5)  # the newest: maybe cut short
    (tmp_path / "last.ckpt").write_bytes(b"l")  # no step: never a resume point
    found = found_in(tmp_path)
    assert steps_of(found) == [
        (10, Layout.TORCHTITAN), (30, Layout.HUGGINGFACE), (50, Layout.GENERIC),
        (80, Layout.LIGHTNING), (90, Layout.LIGHTNING),
    ]  # fmt: skip
    running = complete(found, script_exited_ok=False)
    assert [f.step for f in running] == [10, 30, 50, 80]
    assert [f.step for f in complete(found, script_exited_ok=True)] == [10, 30, 50, 80, 90]
    assert running[0].path == tmp_path / "step-10" and running[3].path.name.endswith(".ckpt")


def test_links_are_never_checkpoints(tmp_path: Path) -> None:
    elsewhere = folder(tmp_path, "elsewhere", ".metadata")
    run = tmp_path / "run"
    run.mkdir()
    (run / "step-10").symlink_to(elsewhere)
    planted = folder(run, "step-20")
    (planted / ".metadata").symlink_to(elsewhere / ".metadata")
    assert found_in(run) == []


def commits(metrics: Path) -> list[tuple[int, str]]:
    if not metrics.exists():
        return []
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [(r["step"], Path(r["path"]).name) for r in rows if r["kind"] == "checkpoint"]


def test_the_watcher_commits_what_the_script_completes_once_oldest_first(tmp_path: Path) -> None:
    """Left from the attempt before: step-10 (the resume point), step-20 (complete, but
    past the resume point: the service rolled back over it) and step-30 (cut short). Only
    what the script writes, or writes again, after its start is this attempt's."""
    run, metrics = tmp_path / "run", tmp_path / "metrics.jsonl"
    run.mkdir()
    folder(run, "step-10", ".metadata")
    stale = folder(run, "step-20", ".metadata")
    folder(run, "step-30")
    watcher = CheckpointWatcher(run, FileReporter(metrics), after_step=10)

    assert watcher.scan(script_exited_ok=False) == []  # nothing of this attempt's yet
    (run / "step-30" / ".metadata").write_text("{}")  # the script completes step 30 again
    folder(run, "step-40")  # and starts 40
    assert steps_of(watcher.scan(script_exited_ok=False)) == [(30, Layout.TORCHTITAN)]
    (run / "step-40" / ".metadata").write_text("{}")
    assert watcher.scan(script_exited_ok=False)[0].step == 40
    assert watcher.scan(script_exited_ok=True) == []  # each once
    assert commits(metrics) == [(30, "step-30"), (40, "step-40")]
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    assert all(r["state"] == "COMMITTED" and r["num_bytes"] == 102 for r in rows)
    assert all(Path(r["path"]).is_absolute() for r in rows)
    # The stale step-20, rewritten after the newer 40 was committed, is not committed again.
    (stale / ".metadata").write_text('{"rewritten": 1}')
    assert watcher.scan(script_exited_ok=True) == []


def test_lightnings_newest_file_is_committed_once_a_later_one_exists_or_at_a_clean_exit(
    tmp_path: Path,
) -> None:
    metrics = tmp_path / "metrics.jsonl"
    watcher = CheckpointWatcher(tmp_path / "run", FileReporter(metrics), after_step=0)
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "epoch=0-step=100.ckpt").write_bytes(b"half written")
    assert watcher.scan(script_exited_ok=False) == []
    (tmp_path / "run" / "epoch=0-step=200.ckpt").write_bytes(b"started")
    assert [f.step for f in watcher.scan(script_exited_ok=False)] == [100]
    assert [f.step for f in watcher.scan(script_exited_ok=True)] == [200]

    crashed = tmp_path / "crashed.jsonl"
    watcher = CheckpointWatcher(tmp_path / "run2", FileReporter(crashed), after_step=0)
    (tmp_path / "run2").mkdir()
    (tmp_path / "run2" / "step-5.ckpt").write_bytes(b"maybe cut short by the crash")
    watcher.stop(script_exited_ok=False)  # never started: the last look alone
    assert commits(crashed) == []
