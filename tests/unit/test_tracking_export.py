"""The tracker export on real Postgres rows and real trackers: TensorBoard event files read
back with TensorBoard's own readers, and W&B offline run folders read back from wandb's
records. A run that restarted is one tracker run with each step once, the surviving
timeline's values, its recovery as an event and its end; an exporter that died between a
send and its record resumes from what the tracker holds, doubling nothing."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from service.config import Settings
from service.models import (
    AttemptState,
    Checkpoint,
    CheckpointState,
    ExportState,
    Metric,
    Run,
    RunState,
    TrackerExport,
    TrackerKind,
)
from service.runs.run_state_machine import record_event, set_run_state
from service.tracking import exportable
from service.tracking.export import Exporter
from service.tracking.export_loop import ensure_exports
from service.tracking.tensorboard_sink import TensorBoardSink, read_folder, texts
from service.tracking.wandb_log import read_run
from service.tracking.wandb_sink import WandbSink, wait_for_a_new_folder_name
from tests.fixtures.rows import add_attempt, add_run
from tests.fixtures.trackers import tensorboard_scalars

SPEC = {"global_batch": 8, "seq_len": 128, "checkpoint_every": 10, "steps": 60}


def loss_of(attempt: int, step: int) -> float:
    """Each attempt's loss differs slightly: the tracker must hold the surviving one's."""
    return 10.0 - step * 0.1 + attempt * 0.001


def train(session: Session, run: Run, attempt: Any, steps: range, commits: list[int]) -> None:
    for step in steps:
        session.add(
            Metric(
                run_id=run.id,
                attempt_id=attempt.id,
                step=step,
                loss=loss_of(attempt.number, step),
                tokens_per_s=10_000.0,
                step_time_s=0.1,
                lr=1e-3,
            )
        )
    for step in commits:
        session.add(
            Checkpoint(
                run_id=run.id,
                attempt_id=attempt.id,
                step=step,
                path=f"/ckpt/{run.id}/step_{step:08d}",
                state=CheckpointState.COMMITTED,
            )
        )
    session.flush()


def a_run_that_lost_a_node(session: Session, tracking: dict[str, Any]) -> tuple[Run, Any]:
    """Attempt 1 trained 1..37 and committed 10, 20, 30, then lost a node; attempt 2
    resumed from 30 and trains on."""
    run = add_run(
        session, RunState.RUNNING, team="vision", name="tiny", spec=SPEC | {"tracking": tracking}
    )
    first = add_attempt(session, run, 1, AttemptState.RUNNING)
    train(session, run, first, range(1, 38), [10, 20, 30])
    record_event(session, run, "attempt.failed", "attempt 1: failed (node_failure)", first)
    record_event(
        session,
        run,
        "recovery.spare_assigned",
        "gpu002 drained (xid:79); spare gpu003 takes its place",
        data={"incident": 1, "failed": "gpu002", "spare": "gpu003"},
    )
    second = add_attempt(session, run, 2, AttemptState.RUNNING, resume_step=30)
    return run, second


def export_all(exporter: Exporter, session: Session, kind: TrackerKind) -> TrackerExport:
    ensure_exports(session, kind)
    export = session.query(TrackerExport).filter_by(tracker=kind).one()
    while exporter.export(export.id):
        pass
    session.refresh(export)
    return export


@contextmanager
def the_same(session: Session) -> Iterator[Session]:
    """The exporter's transactions, inside the test's (rolled back after it): a flush
    where session_scope would commit."""
    yield session
    session.flush()


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        state_dir=tmp_path, tensorboard_root=tmp_path / "tb", wandb_dir=tmp_path / "wandb"
    )


def test_tensorboard_gets_every_settled_step_once_and_the_recovery(
    db_session: Session, settings: Settings
) -> None:
    run, second = a_run_that_lost_a_node(db_session, {"tensorboard": True})
    exporter = Exporter(TensorBoardSink(settings), settings, sessions=lambda: the_same(db_session))

    export = export_all(exporter, db_session, TrackerKind.TENSORBOARD)
    assert export.exported_step == 30, "steps after the newest commit may be trained again"
    folder = Path(export.tracker_run_id or "")
    assert folder == settings.tensorboard_root / "vision" / f"{run.id}-tiny"  # type: ignore[operator]

    train(db_session, run, second, range(31, 61), [40, 50, 60])
    set_run_state(db_session, run, RunState.SUCCEEDED, "trained every step")
    export = export_all(exporter, db_session, TrackerKind.TENSORBOARD)

    values, written = tensorboard_scalars(folder)
    print(f"steps {min(values)}..{max(values)}, most writes of one step {max(written.values())}")
    assert sorted(values) == list(range(1, 61)) and set(written.values()) == {1}
    for step in range(1, 61):  # attempt 2's values where both attempts trained the step
        assert values[step] == pytest.approx(loss_of(1 if step <= 30 else 2, step), abs=1e-5)
    events = [text for _, text in texts(read_folder(folder), "runyard/events")]
    assert any("recovery.spare_assigned" in t and "xid:79" in t for t in events), events
    [(_, final)] = texts(read_folder(folder), "runyard/final")
    assert "final_state: SUCCEEDED" in final and f"runyard run export {run.id} --step 60" in final
    assert export.state == ExportState.FINISHED and export.exported_step == 60


def test_an_exporter_killed_after_a_send_resumes_from_what_the_tracker_holds(
    db_session: Session, settings: Settings
) -> None:
    run, second = a_run_that_lost_a_node(db_session, {"tensorboard": True})
    first_process = Exporter(
        TensorBoardSink(settings), settings, sessions=lambda: the_same(db_session)
    )
    export = export_all(first_process, db_session, TrackerKind.TENSORBOARD)
    train(db_session, run, second, range(31, 61), [40, 50, 60])
    set_run_state(db_session, run, RunState.SUCCEEDED, "trained every step")
    # The next batch reaches TensorBoard, and the process dies before recording it.
    tracked = exportable.tracked_run(run)
    rows = exportable.step_rows(db_session, run, 30, 60)
    first_process.sink.log(export.tracker_run_id or "", tracked, rows, [], 60)
    first_process.sink.release(export.tracker_run_id or "")
    db_session.refresh(export)
    assert export.exported_step == 30, "the cursor never heard of that batch"

    restarted = Exporter(TensorBoardSink(settings), settings, sessions=lambda: the_same(db_session))
    export = export_all(restarted, db_session, TrackerKind.TENSORBOARD)
    values, written = tensorboard_scalars(Path(export.tracker_run_id or ""))
    doubled = sorted(step for step, n in written.items() if n > 1)
    files = list(Path(export.tracker_run_id or "").glob("events.*"))
    print(f"event files {len(files)}, steps written twice {doubled}")
    assert sorted(values) == list(range(1, 61)) and doubled == []
    assert export.state == ExportState.FINISHED


def test_sdc_checks_hold_the_export_back_to_the_last_clean_comparison(
    db_session: Session,
) -> None:
    run, _ = a_run_that_lost_a_node(db_session, {"tensorboard": True})
    assert exportable.settled_step(db_session, run) == 30
    run.config = {**run.config, "sdc_clean_step": 25}
    assert exportable.settled_step(db_session, run) == 25


def test_wandb_offline_run_is_one_run_with_each_step_once(
    db_session: Session, settings: Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")  # no network, ever
    run, second = a_run_that_lost_a_node(
        db_session, {"wandb": {"project": "tiny", "entity": "lab"}}
    )
    first_process = Exporter(WandbSink(settings), settings, sessions=lambda: the_same(db_session))
    export = export_all(first_process, db_session, TrackerKind.WANDB)
    train(db_session, run, second, range(31, 61), [40, 50, 60])
    tracked = exportable.tracked_run(run)
    rows = exportable.step_rows(db_session, run, 30, 50)  # sent, then the service died
    first_process.sink.log(export.tracker_run_id or "", tracked, rows, [], 50)
    first_process.sink.release(export.tracker_run_id or "")
    set_run_state(db_session, run, RunState.SUCCEEDED, "trained every step")

    restarted = Exporter(WandbSink(settings), settings, sessions=lambda: the_same(db_session))
    export = export_all(restarted, db_session, TrackerKind.WANDB)
    log = read_run(settings.wandb_dir / "vision", f"runyard-{run.id}")  # type: ignore[operator]
    losses = log.values("loss")
    print(
        f"folders {log.num_folders}, loss rows {log.rows_logged('loss')}, alerts {len(log.alerts)}"
    )
    assert log.num_folders == 2, "one W&B run, continued by the restarted service"
    assert sorted(losses) == list(range(1, 61)) and log.rows_logged("loss") == 60
    assert losses[35] == pytest.approx(loss_of(2, 35))
    assert any("recovery.spare_assigned" in title for title, _ in log.alerts), log.alerts
    assert log.summary["runyard/final_state"] == "SUCCEEDED"
    assert log.config["spec.global_batch"] == "8" and "plan.mfu" in log.config
    assert export.state == ExportState.FINISHED


def test_a_site_without_mlflow_refuses_a_run_that_asks_for_it(api: Any) -> None:
    spec = {
        "name": "wants-mlflow",
        "model": "tiny",
        "nodes": 1,
        "gpus_per_node": 1,
        "seq_len": 64,
        "global_batch": 8,
        "steps": 10,
        "checkpoint_every": 5,
        "tracking": {"mlflow": {"experiment": "x"}},
    }
    refused = api.post("/v1/runs/dry-run", json=spec)
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"].startswith("tracking.mlflow:")


def test_a_continued_wandb_run_never_reuses_the_folder_of_the_same_second(
    tmp_path: Path,
) -> None:
    """W&B names a folder by its start second: a continuation in the same second as the
    process before it wrote into that folder, and lost the steps the first had logged."""
    import time
    from datetime import datetime

    def now() -> str:
        return datetime.now().strftime("%Y%m%d_%H%M%S")

    run_id = "runyard-7"
    folder = tmp_path / f"offline-run-{now()}-{run_id}"
    folder.mkdir()
    (folder / f"run-{run_id}.wandb").touch()
    started = time.monotonic()
    wait_for_a_new_folder_name([folder / f"run-{run_id}.wandb"], run_id)
    assert now() not in folder.name and time.monotonic() - started < 1.1
