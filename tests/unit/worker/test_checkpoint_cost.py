"""A save's cost to training reaches the run's goodput: blocking time plus overlapped excess.

The worker trains (gloo, one CPU rank) at a steady pace with two slowed saves: one whose
writer holds the GIL for a while (serialisation that never releases it: training's thread
stops, though it never waits for the save), one whose writer sleeps (a slow filesystem:
training steps on beside it). The first must cost about the time it held the GIL, the second
about nothing, and the run's goodput breakdown, computed by the service from what the
worker reported, must count exactly that as checkpoint badput: neither the blocking time
alone (which misses the first) nor the write times (which count the second whole).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from sqlalchemy.orm import Session
from worker_helpers import tiny_spec

from contract import WorkerRunConfig
from service.models import AttemptState
from service.models.base import utcnow
from service.runs import repository
from service.runs.goodput import compute_goodput
from service.workers import service as workers
from service.workers.schemas import CheckpointReport
from tests.fixtures.rows import add_attempt, add_run
from worker.distributed import read_launch_env
from worker.reporter import FileReporter
from worker.train import train

GIL_HELD_S = 2.0  # the first save's writer holds the GIL this long
SLOW_WRITE_S = 1.0  # the second save's writer sleeps this long, hidden by the steps beside it
STEP_S = 0.1  # every step takes at least this long (pace_step): a steady pace to compare with
EVERY = 16  # steps between saves: 1.6 s of training, more than the slow write


@pytest.mark.timeout(120)
def test_a_slowed_save_is_the_runs_checkpoint_badput(
    tmp_path: Path,
    data_cache_dir: Path,
    monkeypatch: pytest.MonkeyPatch,
    db_session: Session,
) -> None:
    monkeypatch.setenv(
        "RUNYARD_FAULT",
        f"pace_step:1:*={STEP_S},gil_checkpoint_write:{EVERY}={GIL_HELD_S},"
        f"slow_checkpoint_write:{2 * EVERY}={SLOW_WRITE_S}",
    )
    spec = tiny_spec(
        tmp_path / "ckpt",
        data_cache_dir,
        steps=3 * EVERY,
        checkpoint_every=EVERY,
        keep_checkpoints=3,
        report_interval_s=0.5,
    )
    metrics = tmp_path / "metrics.jsonl"
    train(WorkerRunConfig.model_validate(spec), read_launch_env({}), FileReporter(metrics))
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    reported = {
        row["step"]: row
        for row in rows
        if row["kind"] == "checkpoint" and row["state"] == "COMMITTED"
    }
    assert sorted(reported) == [EVERY, 2 * EVERY, 3 * EVERY]
    held, hidden = reported[EVERY], reported[2 * EVERY]
    # The GIL held by the writer stopped training for about that long (a step's sleep may
    # absorb up to a step of it), though training never waited for the save itself.
    assert 0.8 * GIL_HELD_S <= held["stall_s"] <= GIL_HELD_S + 0.7, held
    # The slow write ran beside training: it took its time, and cost little (what is left
    # is the write's own work, which shares this machine's two cores with training).
    assert hidden["write_s"] >= SLOW_WRITE_S, hidden
    assert hidden["stall_s"] < 0.5, hidden

    # The service records what the worker reported, and goodput counts it as badput.
    run_spec = {"name": "tiny", "model": "tiny", "nodes": 1, "gpus_per_node": 1, "steps": 48}
    run = add_run(db_session, spec={**run_spec, "seq_len": 64, "global_batch": 8})
    attempt = add_attempt(db_session, run, 1, AttemptState.RUNNING, started_at=utcnow())
    for row in reported.values():
        fields = {k: row[k] for k in ("step", "path", "state", "num_bytes", "write_s", "stall_s")}
        workers.record_checkpoint(db_session, attempt.id, CheckpointReport(**fields))
    checkpoints = repository.checkpoints(db_session, run.id)
    goodput = compute_goodput(run, [attempt], checkpoints)
    badput = goodput.lost.checkpoint_stalls_s
    assert badput == pytest.approx(sum(row["stall_s"] for row in reported.values()))
    # Less the attempt's last save, whose whole write training waits for before it exits,
    # the badput is about the time the first save's writer held the GIL (not the writes'
    # time, which counts the slow write whole).
    slowed = badput - reported[3 * EVERY]["stall_s"]
    assert 0.8 * GIL_HELD_S <= slowed <= GIL_HELD_S + 1.0, goodput.lost
