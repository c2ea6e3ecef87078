"""/metrics and the JSON logs: names by Prometheus' conventions, values from real Postgres
rows, recovery phases from incident stamps, ids on every log line."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy.orm import Session, sessionmaker

import service.db
from service.admin.gauges import StateCollector
from service.models import AttemptState, Incident, Metric, Node, NodeState, RunState
from service.models.base import utcnow
from service.observability.logging import JsonFormatter, log_context
from service.observability.metrics import REGISTRY, observe_incident
from tests.fixtures.rows import add_attempt, add_run


def samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of an exposition, keyed by (name, sorted labels)."""
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def scrape_state(
    session: Session, goodput_low_after_s: float = 3600.0
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    @contextmanager
    def factory() -> Iterator[Session]:
        yield session

    registry = CollectorRegistry()
    registry.register(StateCollector(factory, goodput_low_after_s))
    return samples(generate_latest(registry).decode())


def test_state_gauges_follow_the_database(db_session: Session) -> None:
    before = scrape_state(db_session)
    now = utcnow()
    db_session.add_all(
        [
            Node(
                cluster="default",
                name="obs001",
                state=NodeState.SPARE,
                last_heartbeat_at=now - timedelta(seconds=7),
            ),
            Node(cluster="default", name="obs002", state=NodeState.DRAINED, num_app_errors=0),
        ]
    )
    run = add_run(db_session, RunState.RUNNING, name="watched", tokens_per_s=10000.0)
    attempt = add_attempt(
        db_session, run, 1, AttemptState.RUNNING, started_at=now - timedelta(seconds=100)
    )
    attempt.first_step_at = now - timedelta(seconds=90)
    db_session.add(Metric(run_id=run.id, attempt_id=attempt.id, step=1, loss=5.0))
    db_session.flush()

    after = scrape_state(db_session)

    def delta(name: str, **labels: str) -> float:
        key = (name, tuple(sorted(labels.items())))
        return after[key] - before.get(key, 0.0)

    assert after[("runyard_database_up", ())] == 1
    assert delta("runyard_runs", state="RUNNING") == 1
    # Node gauges are per cluster: a node is (cluster, name).
    on = {"cluster": "default"}
    assert delta("runyard_nodes", state="SPARE", **on) == 1
    assert delta("runyard_nodes", state="DRAINED", **on) == 1
    assert delta("runyard_spare_pool_nodes", **on) == 1
    lag = ("runyard_node_heartbeat_lag_seconds", (("cluster", "default"), ("node", "obs001")))
    assert 6 < after[lag] < 60
    # The only running run: half the plan's 20,000 tokens/s at 40 % MFU -> 20 %. Its
    # goodput (10 s of start-up lost) is below the plan's 0.97, but judged only after an hour.
    assert abs(after[("runyard_running_mfu_ratio", ())] - 0.2) < 1e-9
    assert after[("runyard_runs_below_goodput_budget", ())] == 0
    judged_now = scrape_state(db_session, goodput_low_after_s=60)
    assert judged_now[("runyard_runs_below_goodput_budget", ())] == 1


def test_database_down_is_a_metric_not_an_error() -> None:
    @contextmanager
    def broken() -> Iterator[Session]:
        raise OSError("connection refused")
        yield  # pragma: no cover

    registry = CollectorRegistry()
    registry.register(StateCollector(broken))
    assert samples(generate_latest(registry).decode()) == {("runyard_database_up", ()): 0.0}


def test_recovery_phases_come_from_the_incident_stamps() -> None:
    def count(phase: str) -> float:
        value = REGISTRY.get_sample_value(
            "runyard_recovery_duration_seconds_count", {"phase": phase}
        )
        return value or 0.0

    t0 = utcnow()
    incident = Incident(
        signal_at=t0,
        detected_at=t0 + timedelta(seconds=1),
        drained_at=t0 + timedelta(seconds=2),
        attempt_ended_at=t0 + timedelta(seconds=3),
        submitted_at=t0 + timedelta(seconds=13),
        running_at=t0 + timedelta(seconds=14),
        first_step_at=t0 + timedelta(seconds=20),
    )
    before = {p: count(p) for p in ("drain", "resubmit", "total")}
    total_sum = REGISTRY.get_sample_value(
        "runyard_recovery_duration_seconds_sum", {"phase": "total"}
    )
    observe_incident(incident, "drain", "resubmit", "total")
    assert {p: count(p) - before[p] for p in before} == {"drain": 1, "resubmit": 1, "total": 1}
    new_sum = REGISTRY.get_sample_value("runyard_recovery_duration_seconds_sum", {"phase": "total"})
    assert abs(new_sum - (total_sum or 0.0) - 20.0) < 1e-6


def test_metrics_endpoint_follows_prometheus_conventions(api: Any) -> None:
    assert api.get("/v1/runs").status_code == 200
    response = api.get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    families = list(text_string_to_metric_families(response.text))
    ours = [f for f in families if f.name.startswith("runyard_")]
    assert {f.name for f in ours} >= {
        "runyard_runs",
        "runyard_nodes",
        "runyard_spare_pool_nodes",
        "runyard_spare_pool_target_nodes",
        "runyard_node_events",
        "runyard_recovery_duration_seconds",
        "runyard_http_request_duration_seconds",
        "runyard_runs_below_goodput_budget",
        "runyard_database_up",
    }
    for family in ours:
        assert family.documentation, family.name
        if family.type == "counter":  # the parser strips _total; the samples carry it
            assert all(s.name.endswith(("_total", "_created")) for s in family.samples)
        if family.type == "histogram":
            assert family.name.endswith("_seconds"), family.name
    latency = samples(response.text)
    key = (
        "runyard_http_request_duration_seconds_count",
        (("method", "GET"), ("route", "/v1/runs"), ("status_code", "200")),
    )
    assert latency[key] >= 1


@pytest.fixture
def scrapes_this_transaction(db_session: Session, monkeypatch: pytest.MonkeyPatch) -> None:
    """/metrics reads Postgres in sessions of its own (session_scope): here they share the
    test's connection, so they see its rows, and its rollback removes them."""
    factory = sessionmaker(bind=db_session.connection(), join_transaction_mode="create_savepoint")
    monkeypatch.setattr(service.db, "_session_factory", lambda: factory)


@pytest.mark.usefixtures("scrapes_this_transaction")
def test_metrics_name_no_run_and_no_team(api: Any, db_session: Session) -> None:
    """GET /metrics answers without a token (Prometheus scrapes it), so nothing in it may
    say which runs a team has: no run id, run name or team label, no run's name in a value."""
    now = utcnow()
    for team, name in (("vision", "secret-vision-llama"), ("speech", "secret-speech-asr")):
        run = add_run(db_session, RunState.RUNNING, name=name, team=team, tokens_per_s=10000.0)
        attempt = add_attempt(
            db_session, run, 1, AttemptState.RUNNING, started_at=now - timedelta(hours=3)
        )
        attempt.first_step_at = now - timedelta(hours=2)  # an hour of start-up: below plan
    db_session.flush()

    response = api.get("/metrics", headers={"Authorization": ""})
    assert response.status_code == 200
    labels = {
        label
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
        for label in sample.labels
    }
    print(sorted(labels))
    assert not labels & {"run_id", "run_name", "run", "name", "team", "owner", "user"}
    assert "secret-" not in response.text and "vision" not in response.text
    scraped = samples(response.text)
    assert scraped[("runyard_runs_below_goodput_budget", ())] >= 2
    assert scraped[("runyard_runs", (("state", "RUNNING"),))] >= 2


@contextmanager
def json_lines(logger: str) -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    target = logging.getLogger(logger)
    target.addHandler(handler)
    old_level, target.level = target.level, logging.DEBUG
    try:
        yield stream
    finally:
        target.removeHandler(handler)
        target.level = old_level


def test_json_lines_carry_the_ids_of_their_context() -> None:
    with json_lines("runyard.test") as stream:
        with log_context(run_id=7, node="gpu002"), log_context(incident_id=3):
            logging.getLogger("runyard.test").warning("draining %s", "gpu002")
        logging.getLogger("runyard.test").info("outside")
    inside, outside = (json.loads(line) for line in stream.getvalue().splitlines())
    assert inside["message"] == "draining gpu002" and inside["level"] == "warning"
    assert (inside["run_id"], inside["node"], inside["incident_id"]) == (7, "gpu002", 3)
    assert inside["attempt_id"] is None  # every field on every line, null when unknown
    assert (outside["run_id"], outside["node"]) == (None, None)


def test_an_endpoint_logs_with_the_ids_of_its_path(api: Any) -> None:
    @api.app.get("/v1/runs/{run_id}/probe-log")
    def probe(run_id: int) -> dict[str, int]:  # a sync endpoint, run in the thread pool
        logging.getLogger("runyard.test").info("inside the endpoint")
        return {"run_id": run_id}

    with json_lines("runyard.test") as mine, json_lines("runyard.access") as access:
        assert api.get("/v1/runs/42/probe-log").status_code == 200
    line = json.loads(mine.getvalue().splitlines()[-1])
    assert line["run_id"] == 42
    request = json.loads(access.getvalue().splitlines()[-1])
    assert request["run_id"] == 42 and request["route"] == "/v1/runs/{run_id}/probe-log"
    assert request["status_code"] == 200 and request["duration_ms"] > 0


def test_each_clusters_controller_is_a_gauge(
    db_session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    """runyard_cluster_reachable and _unreachable_seconds, per configured cluster, from
    the reachability the reconciler keeps in Postgres."""
    from service.clusters import reachability, registry
    from service.config_areas.clusters import ClusterConfig, ClusterReach

    configs = (
        ClusterConfig(name="default", reach=ClusterReach.LOCAL),
        ClusterConfig(name="runyard-dev-b"),
    )
    monkeypatch.setattr(registry, "clusters", lambda settings: configs)
    with db_session.begin_nested():
        reachability.record_unreachable(
            db_session, "runyard-dev-b", utcnow() - timedelta(minutes=5), "not responding"
        )
    scraped = scrape_state(db_session)
    assert scraped[("runyard_cluster_reachable", (("cluster", "default"),))] == 1.0
    assert scraped[("runyard_cluster_reachable", (("cluster", "runyard-dev-b"),))] == 0.0
    assert scraped[("runyard_cluster_unreachable_seconds", (("cluster", "default"),))] == 0.0
    silent = scraped[("runyard_cluster_unreachable_seconds", (("cluster", "runyard-dev-b"),))]
    assert 300 <= silent < 400
