"""A worker may report checkpoints only inside its run's own checkpoint folder (issue 38).

The reported path is stored, resumed from, and read by `runyard run export` as whoever
types it; a worker (code of the run's owner) that reports another folder (another run's, a
`..` out of its own, a link it made that leads elsewhere) is refused with a 422 that names
`path`, and nothing is recorded. A path inside the folder is recorded as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from service.config import get_settings
from service.identity.owner_folders import checkpoint_folder
from service.models import AttemptState, Run, RunState
from tests.fixtures.rows import add_attempt, add_run, checkpoint_path


@pytest.fixture
def checkpoint_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The service's checkpoint root, a real folder, so that links in it can be followed."""
    monkeypatch.setenv("RUNYARD_CHECKPOINT_ROOT", str(tmp_path / "checkpoints"))
    get_settings.cache_clear()
    yield tmp_path / "checkpoints"
    get_settings.cache_clear()


def post(api: Any, attempt_id: int, path: str, step: int = 5) -> Any:
    body = {"step": step, "path": path, "state": "COMMITTED"}
    return api.post(f"/v1/worker/attempts/{attempt_id}/checkpoints", json=body)


SPEC = {"name": "r", "model": "tiny", "nodes": 2, "gpus_per_node": 1, "steps": 60}


def a_running_run(session: Session) -> tuple[Run, int]:
    run = add_run(session, RunState.RUNNING, spec={**SPEC, "seq_len": 128, "global_batch": 8})
    return run, add_attempt(session, run, 1, AttemptState.RUNNING).id


def test_a_checkpoint_outside_the_runs_folder_is_a_422_naming_path(
    api: Any, db_session: Session, checkpoint_root: Path, tmp_path: Path
) -> None:
    run, attempt_id = a_running_run(db_session)
    other, _ = a_running_run(db_session)
    folder = checkpoint_folder(get_settings(), run)
    folder.mkdir(parents=True)
    elsewhere = tmp_path / "planted"
    elsewhere.mkdir()
    (folder / "step_00000005").symlink_to(elsewhere)  # made by the owner's job

    for path in (
        str(elsewhere),  # anywhere else
        checkpoint_path(other, 5),  # another run's folder, the same owner's
        f"{folder}/../{checkpoint_folder(get_settings(), other).name}/step_00000005",
        str(folder),  # the folder itself, not a checkpoint in it
        "step_00000005",  # relative: to what?
        str(folder / "step_00000005"),  # a link that leads out
    ):
        response = post(api, attempt_id, path)
        assert response.status_code == 422, (path, response.text)
        assert response.json()["detail"].startswith("path: "), response.json()
    assert "resolves to" in response.json()["detail"]
    assert api.get(f"/v1/runs/{run.id}/checkpoints").json() == []


def test_a_checkpoint_inside_the_runs_folder_is_recorded(
    api: Any, db_session: Session, checkpoint_root: Path
) -> None:
    run, attempt_id = a_running_run(db_session)
    path = checkpoint_path(run, 5)
    response = post(api, attempt_id, path)
    assert response.status_code == 200, response.text
    rows = api.get(f"/v1/runs/{run.id}/checkpoints").json()
    assert [(r["step"], r["path"], r["state"]) for r in rows] == [(5, path, "COMMITTED")]
