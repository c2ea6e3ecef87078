"""Who may call what: real tokens in the real database, the real app in-process.

The role x endpoint matrix is generated from the route table: an endpoint added without a
row in POLICY fails `test_every_route_has_a_policy`, so nobody adds one without deciding.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import pytest
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from service.app import create_app
from service.auth.service import create_token
from service.models import ApiToken, Attempt, AttemptState, Node, NodeState, Role, UserLink
from service.models.base import utcnow
from tests.conftest import wait_for

PUBLIC, USERS, ADMINS, AGENTS, WORKERS = "public", "users", "admins", "agents", "workers"

# Every route and who may call it. USERS means user or admin; AGENTS agent (own node) or
# admin; WORKERS worker (own attempt) or admin.
POLICY: dict[tuple[str, str], str] = {
    ("GET", "/healthz"): PUBLIC,
    ("POST", "/v1/runs"): USERS,
    ("POST", "/v1/runs/dry-run"): USERS,
    ("GET", "/v1/runs"): USERS,
    ("GET", "/v1/runs/{run_id}"): USERS,
    ("POST", "/v1/runs/{run_id}/cancel"): USERS,
    ("GET", "/v1/runs/{run_id}/checkpoints"): USERS,
    ("GET", "/v1/runs/{run_id}/events"): USERS,
    ("GET", "/v1/runs/{run_id}/metrics"): USERS,
    ("GET", "/v1/runs/{run_id}/logs"): USERS,
    ("POST", "/v1/plans"): USERS,
    ("POST", "/v1/sweeps"): USERS,
    ("POST", "/v1/sweeps/dry-run"): USERS,
    ("GET", "/v1/sweeps"): USERS,
    ("GET", "/v1/sweeps/{sweep_id}"): USERS,
    ("POST", "/v1/sweeps/{sweep_id}/cancel"): USERS,
    ("GET", "/v1/nodes"): USERS,
    ("GET", "/v1/clusters"): USERS,
    ("GET", "/v1/nodes/{name}"): USERS,
    ("POST", "/v1/nodes/{name}/heartbeat"): AGENTS,
    ("POST", "/v1/nodes/{name}/events"): AGENTS,
    # The worker protocol versions the service speaks: runyard-client asks before its token.
    ("GET", "/v1/worker/protocol"): PUBLIC,
    ("GET", "/v1/worker/attempts/{attempt_id}/config"): WORKERS,
    ("POST", "/v1/worker/attempts/{attempt_id}/progress"): WORKERS,
    ("POST", "/v1/worker/attempts/{attempt_id}/checkpoints"): WORKERS,
    ("POST", "/v1/worker/attempts/{attempt_id}/finish"): WORKERS,
    ("POST", "/v1/worker/attempts/{attempt_id}/errors"): WORKERS,
    ("POST", "/v1/admin/nodes/{name}/drain"): ADMINS,
    ("POST", "/v1/admin/nodes/{name}/resume"): ADMINS,
    ("GET", "/v1/admin/spares"): ADMINS,
    ("PUT", "/v1/admin/spares"): ADMINS,
    ("GET", "/v1/admin/incidents"): ADMINS,
    ("POST", "/v1/admin/tokens"): ADMINS,
    ("GET", "/v1/admin/tokens"): ADMINS,
    ("DELETE", "/v1/admin/tokens/{token_id}"): ADMINS,
    ("PUT", "/v1/admin/teams/{team}"): ADMINS,
    ("GET", "/v1/admin/audit"): ADMINS,
    ("PUT", "/v1/admin/users/{user}/link"): ADMINS,
    ("DELETE", "/v1/admin/users/{user}/link"): ADMINS,
    ("GET", "/v1/admin/users"): ADMINS,
    ("GET", "/v1/admin/service-identity"): ADMINS,
    ("GET", "/v1/plans/calibration"): USERS,
    ("GET", "/v1/plans/accuracy"): USERS,
    ("GET", "/v1/runs/{run_id}/tracking"): USERS,
    ("POST", "/v1/notifications"): USERS,
    ("GET", "/v1/notifications"): USERS,
    ("DELETE", "/v1/notifications/{subscription_id}"): USERS,
    ("POST", "/v1/notifications/{subscription_id}/test"): USERS,
    ("GET", "/v1/notifications/deliveries"): USERS,
    ("GET", "/metrics"): PUBLIC,
    # A MUNGE credential proves who calls (service/auth/login.py); no token before it.
    ("POST", "/v1/auth/login"): PUBLIC,
    ("POST", "/v1/auth/check"): PUBLIC,  # a MUNGE credential proves who calls; no token made
    ("POST", "/v1/auth/logout"): USERS,
    ("GET", "/v1/tokens"): USERS,
    ("DELETE", "/v1/tokens/{token_id}"): USERS,
}
# Routes that revoke the very token they are called with: the matrix calls them with a token
# of its own, so the world's tokens live on for the next rows.
REVOKES_ITS_TOKEN = {("POST", "/v1/auth/logout")}
ALLOWED = {
    PUBLIC: {"none", "user", "admin", "agent", "worker"},
    USERS: {"user", "admin"},
    ADMINS: {"admin"},
    AGENTS: {"agent", "admin"},
    WORKERS: {"worker", "admin"},
}


@dataclass
class World:
    """Committed rows the tests act on: two teams, one run with an attempt, a node."""

    tokens: dict[str, str]
    run_id: int
    attempt_id: int
    node: str
    other_attempt_id: int


SPEC = {
    "name": "r",
    "model": "tiny",
    "nodes": 1,
    "gpus_per_node": 1,
    "seq_len": 64,
    "global_batch": 4,
    "steps": 10,
    "checkpoint_every": 5,
}


@pytest.fixture(scope="module")
def world(database_url: str, app: Any) -> Iterator[World]:
    """Runs made through the real API by each team; attempts as the reconciler records them."""
    engine = create_engine(database_url)
    tokens: dict[str, str] = {}
    with Session(engine) as s, s.begin():
        if s.get(Node, ("default", "gpu001")) is None:
            s.add(
                Node(
                    cluster="default",
                    name="gpu001",
                    state=NodeState.HEALTHY,
                    state_reason="test",
                    num_app_errors=0,
                )
            )
        for label, role, team, extra in [
            ("user", Role.USER, "alpha", {}),
            ("beta", Role.USER, "beta", {}),
            ("admin", Role.ADMIN, "ops", {}),
            ("agent", Role.AGENT, "ops", {"node_name": "gpu001"}),
        ]:
            _, tokens[label] = create_token(s, user=f"{label}-1", team=team, role=role, **extra)
        _, tokens["expired"] = create_token(
            s, user="old", team="alpha", role=Role.USER, expires_at=utcnow() - timedelta(days=1)
        )
        revoked, tokens["revoked"] = create_token(s, user="gone", team="alpha", role=Role.USER)
        revoked.revoked_at = utcnow()
        for user, unix in (("user-1", "alice"), ("beta-1", "bob")):  # submitters are linked
            if s.get(UserLink, user) is None:
                s.add(UserLink(user=user, unix_user=unix, linked_by="test"))
    run_ids = [
        call(app, tokens[who], "POST", "/v1/runs", json=SPEC).json()["id"]
        for who in ("user", "beta")
    ]
    with Session(engine) as s, s.begin():
        attempts = []
        for run_id in run_ids:
            attempt = Attempt(
                run_id=run_id,
                number=1,
                state=AttemptState.RUNNING,
                job_name="x",
                job_folder="/tmp",
                cluster="default",
                nodes=["gpu001"],
            )
            s.add(attempt)
            s.flush()
            attempts.append(attempt.id)
        _, tokens["worker"] = create_token(
            s,
            user="user-1",
            team="alpha",
            role=Role.WORKER,
            run_id=run_ids[0],
            attempt_id=attempts[0],
        )
    yield World(tokens, run_ids[0], attempts[0], "gpu001", attempts[1])
    # Leave nothing for a reconciler to submit later in this session.
    for run in call(app, tokens["admin"], "GET", "/v1/runs", json=None).json()["items"]:
        if run["state"] in ("PENDING", "RUNNING"):
            call(app, tokens["admin"], "POST", f"/v1/runs/{run['id']}/cancel")
    engine.dispose()


@pytest.fixture(scope="module")
def app() -> Any:
    return create_app()


def call(app: Any, token: str | None, method: str, path: str, json: Any = None) -> Any:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return TestClient(app).request(method, path, headers=headers, json=json)


def api_routes(app: Any) -> set[tuple[str, str]]:
    """Every (method, path) the app serves, those left out of its OpenAPI document too."""
    documented = {(m.upper(), p) for p, ops in app.openapi()["paths"].items() for m in ops}
    hidden = {(m, r.path) for r in app.routes if isinstance(r, APIRoute) for m in r.methods}
    return documented | hidden


def test_every_route_has_a_policy(app: Any) -> None:
    routes = api_routes(app)
    assert ("POST", "/v1/runs") in routes and len(routes) > 20
    missing = sorted(routes - set(POLICY))
    assert not missing, f"decide who may call these, in POLICY: {missing}"


def concrete(path: str, world: World) -> str:
    values = {
        "run_id": world.run_id,
        "attempt_id": world.attempt_id,
        "name": world.node,
        "token_id": 999999,
        "sweep_id": 999999,
        "subscription_id": 999999,
        "team": "alpha",
        "user": "user-1",
    }
    return re.sub(r"\{(\w+)\}", lambda m: str(values[m.group(1)]), path)


@pytest.mark.parametrize(("method", "path"), sorted(POLICY))
@pytest.mark.parametrize("who", ["none", "user", "admin", "agent", "worker"])
def test_role_matrix(
    app: Any, world: World, database_url: str, method: str, path: str, who: str
) -> None:
    if (method, path) not in api_routes(app):
        pytest.skip("route not in this build")
    token = None if who == "none" else world.tokens[who]
    if (method, path) in REVOKES_ITS_TOKEN and who in ("user", "admin"):
        token = throwaway_token(database_url, Role(who))
    # Bodies that fail validation after authorization: auth must answer first.
    response = call(
        app, token, method, concrete(path, world), json={} if method in ("POST", "PUT") else None
    )
    allowed = who in ALLOWED[POLICY[(method, path)]]
    if allowed:
        assert response.status_code not in (401, 403), (who, method, path, response.text)
    else:
        assert response.status_code == (401 if who == "none" else 403), (
            who,
            method,
            path,
            response.status_code,
            response.text,
        )
        assert response.json()["error"] in ("unauthenticated", "forbidden")


def throwaway_token(database_url: str, role: Role) -> str:
    """A committed token of `role` that nothing else uses."""
    engine = create_engine(database_url)
    try:
        with Session(engine) as s, s.begin():
            return create_token(s, user=f"throwaway-{role.value}", team="alpha", role=role)[1]
    finally:
        engine.dispose()


def test_other_teams_runs_do_not_exist(app: Any, world: World) -> None:
    beta = world.tokens["beta"]
    for method, suffix in [
        ("GET", ""),
        ("POST", "/cancel"),
        ("GET", "/checkpoints"),
        ("GET", "/events"),
        ("GET", "/metrics"),
    ]:
        response = call(app, beta, method, f"/v1/runs/{world.run_id}{suffix}")
        assert response.status_code == 404, (suffix, response.text)
        assert "no run with id" in response.json()["detail"]
    listed = call(app, beta, "GET", "/v1/runs").json()["items"]
    assert world.run_id not in [r["id"] for r in listed]
    assert all(r["team"] == "beta" for r in listed)
    mine = call(app, world.tokens["user"], "GET", f"/v1/runs/{world.run_id}")
    assert mine.status_code == 200 and mine.json()["team"] == "alpha"


def test_expired_and_revoked_tokens_are_refused(app: Any, world: World) -> None:
    for label, words in (("expired", "expired"), ("revoked", "revoked")):
        response = call(app, world.tokens[label], "GET", "/v1/runs")
        assert response.status_code == 401 and words in response.json()["detail"]
    assert call(app, "ry_not-a-token", "GET", "/v1/runs").status_code == 401
    assert call(app, None, "GET", "/v1/runs").json()["error"] == "unauthenticated"


def test_agent_speaks_only_for_its_node(app: Any, world: World) -> None:
    other = call(app, world.tokens["agent"], "POST", "/v1/nodes/gpu002/heartbeat", json={})
    assert other.status_code == 403 and "gpu001" in other.json()["detail"]
    own = call(app, world.tokens["agent"], "POST", "/v1/nodes/gpu001/heartbeat", json={})
    assert own.status_code == 204


def test_an_agent_speaks_only_for_its_node_of_its_own_cluster(
    app: Any, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Node names repeat across clusters: an agent token is bound to (cluster, node)."""
    from service.clusters import registry
    from service.config_areas.clusters import ClusterConfig, ClusterReach

    configs = (
        ClusterConfig(name="default", reach=ClusterReach.LOCAL),
        ClusterConfig(name="runyard-dev-b"),
    )
    monkeypatch.setattr(registry, "clusters", lambda settings: configs)
    beat = "/v1/nodes/gpu001/heartbeat"
    # The world's agent token names no cluster: the default cluster's gpu001.
    there = call(app, world.tokens["agent"], "POST", f"{beat}?cluster=runyard-dev-b", json={})
    assert there.status_code == 403, there.text
    assert "gpu001 of cluster default, not gpu001 of runyard-dev-b" in there.json()["detail"]
    wanted = {"user": "agent-b", "team": "ops", "role": "agent", "node_name": "gpu001"}
    made = call(app, world.tokens["admin"], "POST", "/v1/admin/tokens",
                json={**wanted, "cluster": "runyard-dev-b"})  # fmt: skip
    assert made.status_code == 201 and made.json()["node_cluster"] == "runyard-dev-b", made.text
    on_b = made.json()["token"]
    assert call(app, on_b, "POST", beat, json={}).status_code == 403  # the default's gpu001
    own = call(app, on_b, "POST", f"{beat}?cluster=runyard-dev-b", json={})
    assert own.status_code == 404 and "on cluster runyard-dev-b" in own.json()["detail"]
    unknown = call(app, world.tokens["admin"], "POST", "/v1/admin/tokens",
                   json={**wanted, "cluster": "nowhere"})  # fmt: skip
    assert unknown.status_code == 422 and unknown.json()["error"] == "unknown_cluster"
    user_on_b = {"user": "u", "team": "ops", "role": "user", "cluster": "runyard-dev-b"}
    stray = call(app, world.tokens["admin"], "POST", "/v1/admin/tokens", json=user_on_b)
    assert stray.status_code == 422 and "cluster" in stray.json()["detail"]


def test_worker_token_is_scoped_to_its_attempt(app: Any, world: World) -> None:
    other = call(
        app, world.tokens["worker"], "GET", f"/v1/worker/attempts/{world.other_attempt_id}/config"
    )
    assert other.status_code == 403
    assert call(app, world.tokens["worker"], "GET", "/v1/runs").status_code == 403


def test_admin_actions_are_audited(app: Any, world: World) -> None:
    admin = world.tokens["admin"]
    before = call(app, admin, "GET", "/v1/admin/audit").json()
    assert (
        call(app, admin, "PUT", "/v1/admin/teams/alpha", json={"gpu_quota": 64}).status_code == 200
    )
    created = call(
        app,
        admin,
        "POST",
        "/v1/admin/tokens",
        json={"user": "carol", "team": "alpha", "role": "user"},
    ).json()
    assert created["token"].startswith("ry_")
    assert call(app, created["token"], "GET", "/v1/runs").status_code == 200
    assert call(app, admin, "DELETE", f"/v1/admin/tokens/{created['id']}").status_code == 200
    assert call(app, created["token"], "GET", "/v1/runs").status_code == 401
    after = call(app, admin, "GET", "/v1/admin/audit").json()
    actions = [e["action"] for e in after[len(before) :]]
    assert actions == ["team.quota", "token.create", "token.revoke"]
    assert all(e["actor"] == "admin-1" for e in after[len(before) :])
    listed = call(app, admin, "GET", "/v1/admin/tokens").json()
    assert all("token" not in t for t in listed)
    # Users do not read the audit log.
    assert call(app, world.tokens["user"], "GET", "/v1/admin/audit").status_code == 403


def user_of_team_with_quota(app: Any, world: World, team: str, user: str, gpus: int) -> str:
    """A user token of `team`, whose GPU quota an admin set to `gpus`."""
    admin = world.tokens["admin"]
    call(app, admin, "PUT", f"/v1/admin/teams/{team}", json={"gpu_quota": gpus})
    body = {"user": user, "team": team, "role": "user"}
    call(app, admin, "PUT", f"/v1/admin/users/{user}/link", json={"unix_user": "alice"})
    return call(app, admin, "POST", "/v1/admin/tokens", json=body).json()["token"]


def test_quota_refuses_a_run_that_would_exceed_it(app: Any, world: World) -> None:
    gamma = user_of_team_with_quota(app, world, "gamma", "gus", gpus=3)
    spec = {**SPEC, "name": "q", "nodes": 2}
    first = call(app, gamma, "POST", "/v1/runs", json=spec)
    assert first.status_code == 201 and first.json()["team"] == "gamma"
    second = call(app, gamma, "POST", "/v1/runs", json=spec)
    assert second.status_code == 403 and second.json()["error"] == "quota_exceeded"
    assert "quota of 3 GPUs, 2 in use" in second.json()["detail"]
    call(app, gamma, "POST", f"/v1/runs/{first.json()['id']}/cancel")
    assert call(app, gamma, "POST", "/v1/runs", json=spec).status_code == 201


def test_a_sweep_holds_quota_for_the_members_it_runs_at_once(app: Any, world: World) -> None:
    """Admission charges min(max_parallel, points); what counts as in use must agree."""
    delta = user_of_team_with_quota(app, world, "delta", "dee", gpus=3)
    sweep = {**SPEC, "name": "qs", "sweep": {"grid": {"seed": [1, 2, 3, 4, 5]}, "max_parallel": 2}}
    made = call(app, delta, "POST", "/v1/sweeps", json=sweep)
    assert made.status_code == 201, made.text
    # 5 pending members of 1 GPU each, at most 2 at once: 2 of the 3 GPUs are in use.
    assert call(app, delta, "POST", "/v1/runs", json=SPEC).status_code == 201
    refused = call(app, delta, "POST", "/v1/runs", json=SPEC)
    assert refused.status_code == 403 and "quota of 3 GPUs, 3 in use" in refused.json()["detail"]
    assert call(app, delta, "POST", "/v1/sweeps", json=sweep).status_code == 403
    # Down to one live member, the sweep holds one GPU.
    for member in made.json()["runs"][1:]:
        call(app, delta, "POST", f"/v1/runs/{member['id']}/cancel")
    assert call(app, delta, "POST", "/v1/runs", json=SPEC).status_code == 201


def test_oversized_bodies_are_refused_before_they_are_read(app: Any, world: World) -> None:
    big = b'{"name": "' + b"x" * (2 << 20) + b'"}'
    response = TestClient(app).post(
        "/v1/runs",
        content=big,
        headers={
            "Authorization": f"Bearer {world.tokens['user']}",
            "content-type": "application/json",
        },
    )
    assert response.status_code == 413 and response.json()["error"] == "body_too_large"


def test_a_flooding_agent_is_rate_limited(
    app: Any, world: World, monkeypatch: pytest.MonkeyPatch
) -> None:
    from service.auth.deps import agent_limiter
    from service.config import get_settings

    monkeypatch.setenv("RUNYARD_AGENT_REQUESTS_PER_S", "1")
    monkeypatch.setenv("RUNYARD_AGENT_BURST", "5")
    get_settings.cache_clear()
    agent_limiter.cache_clear()
    try:
        client = TestClient(app)
        headers = {"Authorization": f"Bearer {world.tokens['agent']}"}
        codes = [
            client.post("/v1/nodes/gpu001/heartbeat", json={}, headers=headers).status_code
            for _ in range(10)
        ]
        assert codes[:5] == [204] * 5 and 429 in codes[5:]
        limited = client.post("/v1/nodes/gpu001/heartbeat", json={}, headers=headers)
        assert limited.status_code == 429 and "requests/s" in limited.json()["detail"]
        # Admins are not rate-limited: on-call must always get through.
        admin = {"Authorization": f"Bearer {world.tokens['admin']}"}
        ok = client.post("/v1/nodes/gpu001/heartbeat", json={}, headers=admin)
        assert ok.status_code == 204
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
        agent_limiter.cache_clear()


def test_event_batches_are_bounded(app: Any, world: World) -> None:
    events = [{"idempotency_key": f"k-{i:08d}", "kind": "xid", "code": 92} for i in range(1001)]
    response = call(
        app, world.tokens["admin"], "POST", "/v1/nodes/gpu001/events", json={"events": events}
    )
    assert response.status_code == 422 and "events" in response.json()["detail"]


@pytest.fixture
def short_auth_cache(monkeypatch: pytest.MonkeyPatch) -> Iterator[float]:
    """Principals remembered for 1 s, as an operator could set RUNYARD_AUTH_CACHE_TTL_S."""
    from service.config import get_settings

    monkeypatch.setenv("RUNYARD_AUTH_CACHE_TTL_S", "1")
    get_settings.cache_clear()
    yield 1.0
    monkeypatch.undo()
    get_settings.cache_clear()


def test_a_token_revoked_by_another_process_is_refused_within_the_cache_ttl(
    app: Any, database_url: str, short_auth_cache: float
) -> None:
    engine = create_engine(database_url)
    with Session(engine) as s, s.begin():
        row, token = create_token(s, user="dave", team="alpha", role=Role.USER)
        token_id = row.id
    assert call(app, token, "GET", "/v1/runs").status_code == 200  # now cached
    # Revoked straight in the database, as another service process's revocation would be:
    # this process hears nothing of it.
    with Session(engine) as s, s.begin():
        s.get_one(ApiToken, token_id).revoked_at = utcnow()
    revoked_at = time.monotonic()
    wait_for(
        "the revoked token to be refused",
        lambda: call(app, token, "GET", "/v1/runs").status_code == 401,
        timeout_s=short_auth_cache + 2,
        interval_s=0.05,
    )
    assert time.monotonic() - revoked_at < short_auth_cache + 0.5
    engine.dispose()


def test_a_cached_token_is_refused_once_it_expires(app: Any, database_url: str) -> None:
    engine = create_engine(database_url)
    with Session(engine) as s, s.begin():
        expires = utcnow() + timedelta(seconds=1)
        _, token = create_token(s, user="erin", team="alpha", role=Role.USER, expires_at=expires)
    assert call(app, token, "GET", "/v1/runs").status_code == 200  # cached for 10 s
    wait_for(
        "the expired token to be refused",
        lambda: call(app, token, "GET", "/v1/runs").status_code == 401,
        timeout_s=5,
        interval_s=0.05,
    )
    assert utcnow() >= expires
    engine.dispose()


def test_a_worker_token_dies_with_its_attempt_at_once(
    app: Any, world: World, database_url: str
) -> None:
    engine = create_engine(database_url)
    with Session(engine) as s, s.begin():
        attempt = Attempt(
            run_id=world.run_id,
            number=99,
            state=AttemptState.RUNNING,
            job_name="x",
            job_folder="/tmp",
            cluster="default",
            nodes=["gpu001"],
        )
        s.add(attempt)
        s.flush()
        attempt_id = attempt.id
        _, token = create_token(
            s,
            user="user-1",
            team="alpha",
            role=Role.WORKER,
            run_id=world.run_id,
            attempt_id=attempt_id,
        )
    config = f"/v1/worker/attempts/{attempt_id}/config"
    assert call(app, token, "GET", config).status_code not in (401, 403)
    with Session(engine) as s, s.begin():
        s.get_one(Attempt, attempt_id).state = AttemptState.FAILED
    response = call(app, token, "GET", config)
    assert response.status_code == 401 and "attempt" in response.json()["detail"]
    engine.dispose()


@contextmanager
def a_cached_token_and_its_watcher(
    app: Any, database_url: str, monkeypatch: pytest.MonkeyPatch, poll_s: str, user: str
) -> Iterator[tuple[TestClient, dict[str, str], Callable[[], None]]]:
    """A running service (its lifespan starts the revocation watcher, polling every
    `poll_s`; the TTL stays at 60 s) with `user`'s token authenticated and cached, and a
    `revoke()` that revokes it from outside, as another process would."""
    from service.config import get_settings

    monkeypatch.setenv("RUNYARD_AUTH_REVOCATION_POLL_S", poll_s)
    get_settings.cache_clear()
    engine = create_engine(database_url)
    try:
        with Session(engine) as s, s.begin():
            row, token = create_token(s, user=user, team="alpha", role=Role.USER)
            token_id = row.id

        def revoke() -> None:
            with Session(engine) as s, s.begin():
                s.get_one(ApiToken, token_id).revoked_at = utcnow()

        headers = {"Authorization": f"Bearer {token}"}
        with TestClient(app) as client:
            assert client.get("/v1/runs", headers=headers).status_code == 200  # cached
            yield client, headers, revoke
    finally:
        monkeypatch.undo()
        get_settings.cache_clear()
        engine.dispose()


def test_revocations_by_another_process_reach_a_running_service_within_a_poll(
    app: Any, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    watcher = a_cached_token_and_its_watcher(app, database_url, monkeypatch, "0.2", "fay")
    with watcher as (client, headers, revoke):
        revoke()
        revoked_at = time.monotonic()
        wait_for(
            "the watcher to forget the revoked token",
            lambda: client.get("/v1/runs", headers=headers).status_code == 401,
            timeout_s=5,
            interval_s=0.05,
        )
        assert time.monotonic() - revoked_at < 2


def test_a_revocation_made_while_the_watcher_cannot_read_is_seen_when_it_can_again(
    app: Any, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The watcher's reads fail for longer than its read-back window (the database down a
    while): the token revoked meanwhile is forgotten at the first read that works, not
    only when its cache entry expires (the TTL stays at 60 s)."""
    from sqlalchemy.exc import OperationalError

    from service.auth import deps

    window = timedelta(seconds=0.2)
    monkeypatch.setattr(deps, "REVOCATION_WINDOW", window)
    database_down = False
    failed_reads: list[datetime] = []  # when each read the outage refused started
    read_revocations = deps.revoked_since

    def revoked_since(session: Session, since: Any) -> list[int]:
        if database_down:
            failed_reads.append(utcnow())
            raise OperationalError("SELECT api_tokens", {}, ConnectionRefusedError())
        return read_revocations(session, since)

    monkeypatch.setattr(deps, "revoked_since", revoked_since)
    watcher = a_cached_token_and_its_watcher(app, database_url, monkeypatch, "0.1", "gil")
    with watcher as (client, headers, revoke):
        database_down = True
        revoke()
        revoked_at = utcnow()
        # Failed reads until one began more than a window after the revocation: a read
        # back over the window from then would no longer see it.
        wait_for(
            "a failed read more than a window after the revocation",
            lambda: len(failed_reads) >= 2 and failed_reads[-1] - window > revoked_at,
            timeout_s=5,
            interval_s=0.02,
        )
        assert client.get("/v1/runs", headers=headers).status_code == 200, "still cached"
        database_down = False
        wait_for(
            "the watcher to forget the token revoked while it could not read",
            lambda: client.get("/v1/runs", headers=headers).status_code == 401,
            timeout_s=3,
            interval_s=0.05,
        )
