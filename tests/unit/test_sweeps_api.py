"""Sweeps over the API: one run per grid point, and bad grids refused with what to change
(real Postgres; the job array itself is tested on the dev cluster in tests/integration)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import create_engine, delete, func, select
from sqlalchemy.orm import Session

from service.auth.principal import Principal
from service.config import get_settings
from service.models import Role, Run, RunState, Sweep, UserLink
from service.runs.run_state_machine import set_run_state
from service.sweeps.schemas import SweepSpec
from service.sweeps.service import cancel_sweep, create_sweep, members
from tests.unit.test_api_validation import good_spec


def sweep_spec(grid: dict[str, list[Any]], max_parallel: int = 2, **overrides: Any) -> dict:
    return {**good_spec(**overrides), "sweep": {"grid": grid, "max_parallel": max_parallel}}


def count(session: Session, table: type) -> int:
    return session.scalar(select(func.count()).select_from(table)) or 0


def test_a_grid_becomes_one_run_per_point(api: Any, db_session: Session) -> None:
    grid = {"lr": [1e-3, 3e-3], "seed": [1, 2, 3], "parallelism.zero_stage": [0]}
    response = api.post("/v1/sweeps", json=sweep_spec(grid, max_parallel=4, name="grid"))
    assert response.status_code == 201, response.text
    sweep = response.json()
    assert sweep["state"] == "PENDING" and sweep["max_parallel"] == 4
    assert sweep["slurm_array_job_id"] is None and sweep["counts"] == {"PENDING": 6}
    points = [r["params"] for r in sweep["runs"]]
    assert points[0] == {"lr": 1e-3, "seed": 1, "parallelism.zero_stage": 0}
    assert points[5] == {"lr": 3e-3, "seed": 3, "parallelism.zero_stage": 0}
    assert [r["name"] for r in sweep["runs"]] == [f"grid-{i}" for i in range(6)]
    run = api.get(f"/v1/runs/{sweep['runs'][4]['id']}").json()
    assert run["spec"]["lr"] == 3e-3 and run["spec"]["seed"] == 2
    assert run["spec"]["parallelism"]["zero_stage"] == 0 and "sweep" not in run["spec"]
    assert run["layout"]["zero_stage"] == 0
    assert run["sweep_id"] == sweep["id"] and run["sweep_params"] == points[4]
    assert api.get(f"/v1/sweeps/{sweep['id']}").json()["runs"] == sweep["runs"]
    listed = api.get("/v1/sweeps").json()
    assert listed["items"][0]["id"] == sweep["id"] and listed["total"] >= 1


@pytest.mark.parametrize(
    ("grid", "words"),
    [
        ({"nodes": [1, 2]}, "not a field a sweep can vary"),
        ({"parallelism.colour": [1, 2]}, "not a field a sweep can vary"),
        ({"lr": [1e-3]}, "one combination only"),
        ({"lr": []}, "at least one value"),
        ({"lr": [1e-3, -1.0]}, "'lr': -1.0"),
        ({"steps": [10, 20], "checkpoint_every": [50]}, "checkpoint_every"),
        ({"seed": list(range(1001))}, "at most 1000"),
    ],
)
def test_bad_grids_are_refused_and_write_nothing(
    api: Any, db_session: Session, grid: dict[str, list[Any]], words: str
) -> None:
    runs, sweeps = count(db_session, Run), count(db_session, Sweep)
    response = api.post("/v1/sweeps", json=sweep_spec(grid))
    assert response.status_code == 422, response.text
    assert words in response.json()["detail"]
    assert count(db_session, Run) == runs and count(db_session, Sweep) == sweeps


def test_a_grid_sent_as_a_run_is_pointed_to_sweeps(api: Any) -> None:
    response = api.post("/v1/runs", json=sweep_spec({"lr": [1e-3, 3e-3]}))
    assert response.status_code == 422
    assert "POST it to /v1/sweeps" in response.json()["detail"]


def test_cancel_ends_every_unsubmitted_run_and_twice_is_a_409(api: Any) -> None:
    sweep = api.post("/v1/sweeps", json=sweep_spec({"seed": [1, 2, 3]})).json()
    cancelled = api.post(f"/v1/sweeps/{sweep['id']}/cancel")
    assert cancelled.status_code == 202
    assert cancelled.json()["state"] == "CANCELLED"
    assert cancelled.json()["counts"] == {"CANCELLED": 3}
    assert api.post(f"/v1/sweeps/{sweep['id']}/cancel").status_code == 409
    assert api.get("/v1/sweeps/999999").status_code == 404


def test_cancel_leaves_a_member_that_ended_meanwhile_as_it_ended(database_url: str) -> None:
    """The request read the members before the reconciler committed one's end: locking the
    run must show its new state, not overwrite SUCCEEDED with CANCELLING."""
    engine = create_engine(database_url)
    principal = Principal(token_id=0, user="ann", team="race", role=Role.USER)
    spec = SweepSpec.model_validate(sweep_spec({"seed": [1, 2]}, name="race"))
    with Session(engine) as s, s.begin():
        if s.get(UserLink, "ann") is None:  # submitters are linked (service/identity/)
            s.add(UserLink(user="ann", unix_user="alice", linked_by="test"))
        sweep, runs = create_sweep(s, spec, get_settings(), principal)
        for run in runs:
            set_run_state(s, run, RunState.RUNNING, "training")
        sweep_id, first = sweep.id, runs[0].id
    try:
        with Session(engine) as request, request.begin():
            read = members(request, sweep_id)  # held: the session keeps these copies
            assert [r.state for r in read] == [RunState.RUNNING] * 2
            with Session(engine) as reconciler, reconciler.begin():
                ended = reconciler.get(Run, first)
                assert ended is not None
                set_run_state(reconciler, ended, RunState.SUCCEEDED, "trained")
            swept = request.get(Sweep, sweep_id)
            assert swept is not None
            cancel_sweep(request, swept, principal)
        with Session(engine) as s:
            states = [r.state for r in members(s, sweep_id)]
        assert states == [RunState.SUCCEEDED, RunState.CANCELLING]
    finally:
        with Session(engine) as s, s.begin():
            s.execute(delete(Sweep).where(Sweep.id == sweep_id))
        engine.dispose()
