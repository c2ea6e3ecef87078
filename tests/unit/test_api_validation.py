"""Bad specs and unknown ids get clear 4xx answers and write nothing (real Postgres)."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from service.models import Run, RunEvent


def good_spec(**overrides: Any) -> dict[str, Any]:
    spec = {
        "name": "ok",
        "model": "tiny",
        "nodes": 2,
        "gpus_per_node": 1,
        "seq_len": 128,
        "global_batch": 8,
        "steps": 50,
        "checkpoint_every": 10,
    }
    return {**spec, **overrides}


def count(session: Session, table: type) -> int:
    return session.scalar(select(func.count()).select_from(table)) or 0


def test_good_spec_is_accepted_and_planned(api: Any, db_session: Session) -> None:
    response = api.post("/v1/runs", json=good_spec())
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["state"] == "PENDING"
    assert body["layout"]["dp"] == 2 and body["layout"]["micro_batch_size"] == 4
    assert count(db_session, Run) == 1
    assert count(db_session, RunEvent) == 1


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [
        ({"colour": "blue"}, "colour", "Extra inputs"),
        ({"nodes": 0}, "nodes", "greater than or equal to 1"),
        ({"name": "has spaces"}, "name", "pattern"),
        ({"steps": "many"}, "steps", "integer"),
        ({"model": "gpt-17"}, "model", "unknown preset"),
        ({"global_batch": 7}, "global_batch", "divisible by dp"),
        ({"parallelism": {"tp": 3}}, "parallelism", "does not divide"),
        ({"parallelism": {"dp": 2, "micro_batch_size": 3}}, "micro_batch_size", "must divide"),
        (
            {
                "model": {
                    "layers": 2,
                    "hidden": 100,
                    "heads": 3,
                    "kv_heads": 1,
                    "ffn": 64,
                    "vocab": 256,
                }
            },
            "model",
            "divisible by heads",
        ),
        ({"checkpoint_every": 500}, "checkpoint_every", "more than steps"),
        (
            {"parallelism": {"dp": 1, "tp": 2, "micro_batch_size": 1}, "global_batch": 1},
            "parallelism",
            "not supported",
        ),
    ],
)
def test_bad_spec_is_refused_naming_the_field(
    api: Any, db_session: Session, overrides: dict[str, Any], field: str, words: str
) -> None:
    response = api.post("/v1/runs", json=good_spec(**overrides))
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error"] in ("invalid_request", "invalid_spec")
    assert field in body["detail"] and words in body["detail"], body["detail"]
    assert count(db_session, Run) == 0
    assert count(db_session, RunEvent) == 0


def test_body_that_is_not_json_is_a_422(api: Any) -> None:
    response = api.post(
        "/v1/runs", content=b"name: yaml?", headers={"content-type": "application/json"}
    )
    assert response.status_code == 422
    assert response.json()["error"] == "invalid_request"


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/v1/runs/999999"),
        ("POST", "/v1/runs/999999/cancel"),
        ("GET", "/v1/runs/999999/checkpoints"),
        ("GET", "/v1/runs/999999/events"),
        ("GET", "/v1/runs/999999/metrics"),
        ("GET", "/v1/worker/attempts/999999/config"),
        ("POST", "/v1/nodes/gpu999/heartbeat"),
    ],
)
def test_unknown_ids_are_404_with_a_reason(api: Any, method: str, path: str) -> None:
    response = api.request(method, path, json={} if method == "POST" else None)
    assert response.status_code == 404, response.text
    assert response.json()["error"] == "not_found"
    assert response.json()["detail"]


def test_cancel_of_an_unsubmitted_run_ends_it_and_twice_is_a_409(api: Any) -> None:
    run_id = api.post("/v1/runs", json=good_spec()).json()["id"]
    first = api.post(f"/v1/runs/{run_id}/cancel")
    assert first.status_code == 202 and first.json()["state"] == "CANCELLED"
    again = api.post(f"/v1/runs/{run_id}/cancel")
    assert again.status_code == 409
    assert "already ended" in again.json()["detail"]


def test_list_filters_by_state_and_rejects_bad_state(api: Any) -> None:
    api.post("/v1/runs", json=good_spec(name="a"))
    assert api.get("/v1/runs", params={"state": "PENDING"}).json()["total"] == 1
    assert api.get("/v1/runs", params={"state": "SUCCEEDED"}).json()["total"] == 0
    bad = api.get("/v1/runs", params={"state": "DONE"})
    assert bad.status_code == 422 and "state" in bad.json()["detail"]


def test_openapi_is_served(api: Any) -> None:
    paths = api.get("/openapi.json").json()["paths"]
    assert "/v1/runs" in paths and "/v1/worker/attempts/{attempt_id}/progress" in paths
