"""A run writes only into its own team's experiment trackers (issue 38, finding 6b and 6c):
the service logs to MLflow and W&B with its own credentials, so a run's tracker names must
lie in its team's namespace (a 422 naming the field otherwise), and the folders it writes
for TensorBoard and W&B offline are nobody else's to read."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from service.config import Settings, get_settings
from service.models import RunState
from service.runs.tracking_spec import TrackingSpec, outside_namespace
from service.tracking.exportable import tracked_run
from service.tracking.team_folders import team_folder
from service.tracking.tensorboard_sink import TensorBoardSink
from service.tracking.wandb_sink import WandbSink
from tests.fixtures.rows import add_run

SPEC = {
    "name": "named",
    "model": "tiny",
    "nodes": 1,
    "gpus_per_node": 1,
    "seq_len": 64,
    "global_batch": 8,
    "steps": 10,
    "checkpoint_every": 5,
}


@pytest.fixture
def site_with_mlflow(monkeypatch: pytest.MonkeyPatch) -> None:
    """The API's settings with an MLflow server named (nothing is sent at a dry run)."""
    named = get_settings().model_copy(update={"mlflow_tracking_uri": "http://mlflow.invalid"})
    monkeypatch.setattr("service.runs.endpoints.get_settings", lambda: named)


@pytest.mark.usefixtures("site_with_mlflow")
@pytest.mark.parametrize(
    ("tracking", "field"),
    [
        ({"mlflow": {"experiment": "llama"}}, "tracking.mlflow.experiment"),
        ({"mlflow": {"experiment": "vision/llama"}}, "tracking.mlflow.experiment"),
        ({"mlflow": {"experiment": "opsx/llama"}}, "tracking.mlflow.experiment"),
        ({"wandb": {"project": "llama"}}, "tracking.wandb.project"),
        ({"wandb": {"project": "vision-llama"}}, "tracking.wandb.project"),
        ({"wandb": {"project": "ops-llama", "entity": "vision"}}, "tracking.wandb.entity"),
    ],
)
def test_a_tracker_name_outside_the_teams_namespace_is_a_422_naming_it(
    api: Any, tracking: dict[str, Any], field: str
) -> None:
    """The admin token's team is ops: ops, ops/... in MLflow; ops, ops-... in W&B."""
    refused = api.post("/v1/runs/dry-run", json=SPEC | {"tracking": tracking})
    print(refused.json())
    assert refused.status_code == 422, refused.text
    assert refused.json()["detail"].startswith(f"{field}: ")
    assert api.post("/v1/runs", json=SPEC | {"tracking": tracking}).status_code == 422


@pytest.mark.usefixtures("site_with_mlflow")
@pytest.mark.parametrize(
    "tracking",
    [
        {"mlflow": {"experiment": "ops"}},
        {"mlflow": {"experiment": "ops/llama/8b"}},
        {"mlflow": {}},  # the team's own name
        {"wandb": {"project": "ops"}},
        {"wandb": {"project": "ops-llama"}},
        {"tensorboard": True},
    ],
)
def test_a_name_in_the_teams_namespace_is_taken(api: Any, tracking: dict[str, Any]) -> None:
    taken = api.post("/v1/runs/dry-run", json=SPEC | {"tracking": tracking})
    assert taken.status_code == 200, taken.text


def test_a_hyphen_is_the_longest_teams() -> None:
    """Team names may hold a hyphen: team ml may not name team ml-infra's W&B projects."""
    site = Settings(wandb_entity="lab")
    teams = ["ml", "ml-infra"]

    def wandb(project: str, team: str) -> str | None:
        spec = TrackingSpec.model_validate({"wandb": {"project": project}})
        return outside_namespace(spec, team, teams, site)

    assert wandb("ml-llama", "ml") is None and wandb("ml-infra-x", "ml-infra") is None
    assert "it is team ml-infra's" in (wandb("ml-infra-x", "ml") or "")
    assert wandb("ml-infra", "ml") is not None
    lab = TrackingSpec.model_validate({"wandb": {"project": "ml", "entity": "lab"}})
    assert outside_namespace(lab, "ml", teams, site) is None


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    """022, most services' umask: alone, it leaves folders 0755 and files 0644."""
    before = os.umask(0o022)
    yield
    os.umask(before)


def test_tensorboard_folders_and_files_are_not_world_readable(
    db_session: Session, tmp_path: Path
) -> None:
    site = Settings(state_dir=tmp_path, tensorboard_root=tmp_path / "tb")
    run = add_run(db_session, RunState.RUNNING, team="vision", name="tiny")
    sink = TensorBoardSink(site)
    folder, _ = sink.open(tracked_run(run), None)
    sink.release(folder)
    root = tmp_path / "tb"
    made = [root, root / "vision", Path(folder)]
    files = list(Path(folder).glob("events.out.tfevents.*"))
    print({str(p): oct(mode(p)) for p in [*made, *files]})
    assert files and all(mode(p) == 0o640 for p in files)
    assert all(mode(p) & 0o777 == 0o750 for p in made)
    assert mode(root / "vision") & stat.S_ISGID  # what is made under it keeps its group


def test_wandb_folders_are_not_world_readable(
    db_session: Session, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WANDB_MODE", "offline")  # no network, ever
    site = Settings(state_dir=tmp_path, wandb_dir=tmp_path / "wandb")
    run = add_run(
        db_session,
        RunState.RUNNING,
        team="vision",
        name="tiny",
        spec={"tracking": {"wandb": {"project": "vision-tiny"}}},
    )
    sink = WandbSink(site)
    run_id, _ = sink.open(tracked_run(run), None)
    sink.release(run_id)
    for folder in (tmp_path / "wandb", tmp_path / "wandb" / "vision"):
        assert mode(folder) & 0o007 == 0, oct(mode(folder))
    # Everything wandb wrote lies under the team's folder, which others cannot enter.
    assert any((tmp_path / "wandb" / "vision").rglob("*.wandb"))


def test_a_folder_made_before_is_closed_too(tmp_path: Path) -> None:
    (tmp_path / "tb" / "vision").mkdir(parents=True, mode=0o755)
    (tmp_path / "tb" / "vision").chmod(0o755)
    team_folder(tmp_path / "tb", "vision", "1-tiny")
    assert mode(tmp_path / "tb" / "vision") & 0o007 == 0
