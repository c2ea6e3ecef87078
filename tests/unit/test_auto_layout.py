"""`parallelism: auto` is the planner's search: `runyard plan --json` and the service
(POST /v1/runs and its dry run) reach the same layout for the same run on the CPU dev
cluster's planned hardware; a pinned degree stays and the rest is planned; a run the planner
cannot fit is refused with the planner's own reason."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import typer
from sqlalchemy import func, select
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from client.commands.plan import plan as plan_command
from planner.plan import PlanError, plan
from planner.presets import MODEL_PRESETS
from service.config import Settings, get_settings
from service.models import Run

DEGREES = ("dp", "tp", "pp", "cp", "vp", "zero_stage", "micro_batch_size", "recompute")
SEQ, BATCH = 8192, 64  # sequences per step: 512K tokens, Llama 3 70B's early batch size

cli = typer.Typer()
cli.command()(plan_command)


@cli.callback()
def _group() -> None:
    """Mount `plan` as a sub-command, as client/cli.py does."""


@pytest.fixture
def cpu_cluster(monkeypatch: pytest.MonkeyPatch) -> Iterator[Settings]:
    """The dev cluster's settings: ranks train on CPU, runs are planned on its GPU type."""
    monkeypatch.setenv("RUNYARD_ACCELERATOR", "cpu")
    get_settings.cache_clear()
    yield get_settings()
    get_settings.cache_clear()


def runyard_plan(settings: Settings, model: str, gpus: int, *pins: str) -> tuple[int, str]:
    result = CliRunner().invoke(
        cli,
        [
            "plan", "--model", model, "--gpus", str(gpus), "--seq", str(SEQ),
            "--global-batch-tokens", str(BATCH * SEQ), "--hardware", settings.hardware,
            "--network", settings.network, "--gpus-per-node", "8", "--json", *pins,
        ],
    )  # fmt: skip
    return result.exit_code, result.output


def spec(model: str, nodes: int, parallelism: Any = "auto") -> dict[str, Any]:
    return {
        "name": "big-shape",
        "model": model,
        "nodes": nodes,
        "gpus_per_node": 8,
        "seq_len": SEQ,
        "global_batch": BATCH,
        "steps": 10,
        "checkpoint_every": 5,
        "parallelism": parallelism,
    }


def degrees(layout: dict[str, Any]) -> dict[str, Any]:
    return {name: layout[name] for name in DEGREES}


def runs(session: Session) -> int:
    return session.scalar(select(func.count()).select_from(Run)) or 0


def test_a_70b_run_left_on_auto_gets_the_layout_runyard_plan_shows(
    api: Any, db_session: Session, cpu_cluster: Settings
) -> None:
    code, out = runyard_plan(cpu_cluster, "llama3-70b", 64)
    assert code == 0, out
    planned = json.loads(out)["layout"]
    assert planned["tp"] * planned["pp"] * planned["cp"] > 1  # 70B never fits plain DDP

    before = runs(db_session)
    decided = api.post("/v1/runs/dry-run", json=spec("llama3-70b", 8))
    assert decided.status_code == 200, decided.text
    assert runs(db_session) == before  # a dry run creates nothing
    assert degrees(decided.json()["layout"]) == degrees(planned)
    assert decided.json()["pinned"] == []

    created = api.post("/v1/runs", json=spec("llama3-70b", 8))
    assert created.status_code == 201, created.text
    run = created.json()
    assert degrees(run["layout"]) == degrees(planned)
    assert run["layout"]["precision"] == "fp32"  # the ranks compute on CPU here
    assert run["plan"]["layout"] == {**planned, "precision": "bf16"}  # costed as BF16 GPUs
    assert run["plan"]["hardware"] == cpu_cluster.hardware


def test_pinning_one_degree_keeps_it_and_plans_the_rest(api: Any, cpu_cluster: Settings) -> None:
    code, out = runyard_plan(cpu_cluster, "llama3-70b", 64, "--tp", "4")
    assert code == 0, out
    planned = json.loads(out)["layout"]
    free = plan(MODEL_PRESETS["llama3-70b"], cpu_cluster.hardware, 64, SEQ, BATCH * SEQ).layout
    assert free.tp != 4  # the pin is not what the search would choose on its own

    created = api.post("/v1/runs", json=spec("llama3-70b", 8, {"tp": 4}))
    assert created.status_code == 201, created.text
    layout = created.json()["layout"]
    assert layout["tp"] == 4
    assert degrees(layout) == degrees(planned)
    assert layout["dp"] * layout["tp"] * layout["pp"] * layout["cp"] == 64


def test_a_run_the_planner_cannot_fit_is_refused_with_its_reason(
    api: Any, db_session: Session, cpu_cluster: Settings
) -> None:
    with pytest.raises(PlanError) as planner_says:
        plan(MODEL_PRESETS["llama3-405b"], cpu_cluster.hardware, 8, SEQ, BATCH * SEQ)
    code, out = runyard_plan(cpu_cluster, "llama3-405b", 8)
    assert code != 0 and planner_says.value.message in " ".join(out.split())

    before = runs(db_session)
    for path in ("/v1/runs", "/v1/runs/dry-run"):
        refused = api.post(path, json=spec("llama3-405b", 1))
        assert refused.status_code == 422, refused.text
        detail = refused.json()["detail"]
        assert detail.startswith("nodes: "), detail  # the spec field to change
        assert planner_says.value.message in detail
        assert all(advice in detail for advice in planner_says.value.advice)
    assert runs(db_session) == before


def test_a_sweeps_dry_run_decides_every_point_and_creates_nothing(
    api: Any, db_session: Session, cpu_cluster: Settings
) -> None:
    sweep = {
        **spec("llama3-8b", 2),
        "sweep": {"grid": {"parallelism.tp": [1, 8], "lr": [1e-4, 3e-4]}, "max_parallel": 2},
    }
    before = runs(db_session)
    decided = api.post("/v1/sweeps/dry-run", json=sweep)
    assert decided.status_code == 200, decided.text
    points = decided.json()["points"]
    assert len(points) == 4 and runs(db_session) == before
    for point in points:
        assert point["decision"]["layout"]["tp"] == point["params"]["parallelism.tp"]
        assert point["decision"]["pinned"] == ["tp"]

    sweep["sweep"]["grid"]["parallelism.tp"] = [1, 16]  # tp 16 leaves the node
    refused = api.post("/v1/sweeps/dry-run", json=sweep)
    assert refused.status_code == 422 and "parallelism.tp': 16" in refused.text, refused.text
