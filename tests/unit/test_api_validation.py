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
    runs, events = count(db_session, Run), count(db_session, RunEvent)
    response = api.post("/v1/runs", json=good_spec())
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["state"] == "PENDING"
    assert body["layout"]["dp"] == 2 and body["layout"]["micro_batch_size"] == 4
    assert count(db_session, Run) == runs + 1
    assert count(db_session, RunEvent) == events + 1


@pytest.mark.parametrize(
    ("overrides", "field", "words"),
    [
        ({"colour": "blue"}, "colour", "Extra inputs"),
        ({"nodes": 0}, "nodes", "greater than or equal to 1"),
        ({"name": "has spaces"}, "name", "pattern"),
        ({"steps": "many"}, "steps", "integer"),
        ({"model": "gpt-17"}, "model", "unknown preset"),
        ({"global_batch": 7, "parallelism": {"dp": 2}}, "global_batch", "divisible by dp"),
        ({"parallelism": {"tp": 3}}, "parallelism", "does not divide"),
        (
            {"parallelism": {"dp": 2, "micro_batch_size": 3}},
            "micro_batch_size",
            "must be divisible by dp x micro_batch_size",
        ),
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
            # tp peers must share a node's NVLink domain; this node has 1 rank.
            {"parallelism": {"dp": 1, "tp": 2, "micro_batch_size": 1}, "global_batch": 1},
            "tp",
            "must stay inside one node",
        ),
    ],
)
def test_bad_spec_is_refused_naming_the_field(
    api: Any, db_session: Session, overrides: dict[str, Any], field: str, words: str
) -> None:
    runs, events = count(db_session, Run), count(db_session, RunEvent)
    response = api.post("/v1/runs", json=good_spec(**overrides))
    assert response.status_code == 422, response.text
    body = response.json()
    assert body["error"] in ("invalid_request", "invalid_spec")
    assert field in body["detail"] and words in body["detail"], body["detail"]
    assert count(db_session, Run) == runs
    assert count(db_session, RunEvent) == events


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
    pending = api.get("/v1/runs", params={"state": "PENDING"}).json()["total"]
    api.post("/v1/runs", json=good_spec(name="a"))
    assert api.get("/v1/runs", params={"state": "PENDING"}).json()["total"] == pending + 1
    listed = api.get("/v1/runs", params={"state": "SUCCEEDED"}).json()["items"]
    assert all(r["state"] == "SUCCEEDED" for r in listed)
    bad = api.get("/v1/runs", params={"state": "DONE"})
    assert bad.status_code == 422 and "state" in bad.json()["detail"]


def test_openapi_is_served(api: Any) -> None:
    paths = api.get("/openapi.json").json()["paths"]
    assert "/v1/runs" in paths and "/v1/worker/attempts/{attempt_id}/progress" in paths


def test_a_run_that_cannot_fit_is_refused_with_what_would_help(
    api: Any, db_session: Session
) -> None:
    runs = count(db_session, Run)
    response = api.post(
        "/v1/runs", json=good_spec(model="llama3-405b", seq_len=8192, global_batch=16, steps=10)
    )
    assert response.status_code == 422, response.text
    detail = response.json()["detail"]
    assert "does not fit" in detail and "GiB more than" in detail, detail
    assert count(db_session, Run) == runs


def test_accepted_run_carries_its_plan(api: Any) -> None:
    body = api.post("/v1/runs", json=good_spec()).json()
    plan = body["plan"]
    assert plan["layout"]["dp"] == 2 and plan["memory_gib_per_gpu"]["total"] > 0
    assert 0 < plan["mfu"] < 1


def test_plans_endpoint_answers_and_refuses(api: Any) -> None:
    client = api
    ok = client.post(
        "/v1/plans",
        json={
            "model": "llama3-8b",
            "gpus": 64,
            "seq_len": 8192,
            "global_batch_tokens": 4 * 1024 * 1024,
        },
    )
    assert ok.status_code == 200, ok.text
    body = ok.json()
    assert (
        body["layout"]["dp"] * body["layout"]["tp"] * body["layout"]["pp"] * body["layout"]["cp"]
        == 64
    )
    assert body["memory_gib_per_gpu"]["total"] <= body["memory_gib_per_gpu"]["capacity"]
    bad = client.post(
        "/v1/plans",
        json={"model": "llama3-8b", "gpus": 64, "seq_len": 8192, "global_batch_tokens": 1000},
    )
    assert bad.status_code == 422 and "global_batch_tokens" in bad.json()["detail"]


def test_fp8_is_refused_before_any_rank_starts(
    api: Any, db_session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.config import get_settings

    monkeypatch.setenv("RUNYARD_ACCELERATOR", "cpu")
    get_settings.cache_clear()
    try:
        runs = count(db_session, Run)
        response = api.post("/v1/runs", json=good_spec(parallelism={"precision": "fp8"}))
        assert response.status_code == 422
        assert "fp8 cannot run here" in response.json()["detail"]
        assert count(db_session, Run) == runs
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
