"""The checkpoint interval the service re-derives while a run trains reaches every rank: rank
0 reads it from the progress reply, the next report shares it, and the loop saves on it."""

from __future__ import annotations

import json
from pathlib import Path

from worker_helpers import FakeService, tiny_spec

from contract import WorkerRunConfig
from worker.launch import read_launch_env
from worker.reporter import FileReporter, HttpReporter
from worker.train import train


def test_the_reporter_reads_the_interval_from_the_progress_reply(
    fake_service: FakeService,
) -> None:
    fake_service.progress_reply = {"checkpoint_every": 7}
    reporter = HttpReporter(fake_service.url, 7, node="n", interval_s=10.0)
    reporter.metric(1, 4.0, 1.0, 0.1)
    reporter.flush_once()
    assert reporter.checkpoint_every == 7
    fake_service.progress_reply = {"checkpoint_every": None}  # pinned: keep the config's
    reporter.metric(2, 4.0, 1.0, 0.1)
    reporter.flush_once()
    assert reporter.checkpoint_every is None
    reporter.close()


class AnnouncedInterval(FileReporter):
    """Rank 0's reporter once the service has answered with an interval of 4 steps."""

    checkpoint_every = 4


def test_the_loop_saves_on_the_interval_the_service_announced(
    tmp_path: Path, data_cache_dir: Path
) -> None:
    spec = tiny_spec(tmp_path / "ckpt", data_cache_dir, steps=12, checkpoint_every=1000)
    metrics = tmp_path / "metrics.jsonl"
    train(WorkerRunConfig.model_validate(spec), read_launch_env({}), AnnouncedInterval(metrics))
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    committed = [r["step"] for r in rows if r["kind"] == "checkpoint" and r["state"] == "COMMITTED"]
    # Every step reports at first, so the word is shared after step 1: saves at 4, 8, 12
    # instead of only the final one at 12.
    assert committed == [4, 8, 12]
