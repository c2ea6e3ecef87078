"""GET /v1/clusters, the `cluster` filters, a spec's `cluster:` and an agent's cluster,
on the real API and Postgres. Two clusters are configured by replacing the registry's list
(the file's own parsing is tested in test_cluster_config.py); their controllers by
replacing the probe."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy.orm import Session

from service.clusters import reachability, registry
from service.config_areas.clusters import ClusterConfig, ClusterReach
from service.models import Node, NodeState
from service.models.base import utcnow
from service.slurm.fake import DEFAULT_FAKE_CLUSTER
from tests.fixtures.rows import add_run
from tests.unit.test_api_validation import good_spec

OTHER = "runyard-dev-b"


@pytest.fixture
def two_clusters(monkeypatch: pytest.MonkeyPatch) -> None:
    configs = (
        ClusterConfig(name=DEFAULT_FAKE_CLUSTER, reach=ClusterReach.LOCAL),
        ClusterConfig(name=OTHER, spare_pool_target=1),
    )
    monkeypatch.setattr(registry, "clusters", lambda settings: configs)

    def probe(settings: Any, config: ClusterConfig) -> registry.ClusterProbe:
        if config.name == OTHER:
            return registry.ClusterProbe(
                config, registry.ClusterState.UNREACHABLE, None, "slurmctld not responding"
            )
        return registry.ClusterProbe(config, registry.ClusterState.REACHABLE, "24.11.5")

    monkeypatch.setattr(registry, "probe", probe)


def add_node(session: Session, cluster: str, name: str, state: NodeState, **fields: Any) -> None:
    values = {"state_reason": "test", "num_app_errors": 0, "num_gpus": 8, **fields}
    session.add(Node(cluster=cluster, name=name, state=state, **values))
    session.flush()


def busy_default_nodes(session: Session) -> None:
    """Two busy nodes on the default cluster: big enough for good_spec's two nodes, none
    free (the shared test database may hold a node of it that another test left)."""
    for name in ("zz008", "zz009"):
        add_node(session, DEFAULT_FAKE_CLUSTER, name, NodeState.HEALTHY, slurm_state="MIXED")


@pytest.mark.usefixtures("two_clusters")
def test_the_cluster_list_counts_each_clusters_nodes(api: Any, db_session: Session) -> None:
    # The same name on both clusters: a node is (cluster, name).
    add_node(db_session, DEFAULT_FAKE_CLUSTER, "zz001", NodeState.HEALTHY, slurm_state="IDLE")
    add_node(db_session, DEFAULT_FAKE_CLUSTER, "zz002", NodeState.SPARE, slurm_state="IDLE")
    add_node(db_session, OTHER, "zz001", NodeState.HEALTHY, slurm_state="IDLE+DRAIN")
    response = api.get("/v1/clusters")
    assert response.status_code == 200, response.text
    here, there = response.json()
    assert (here["name"], here["default"], here["state"]) == (
        DEFAULT_FAKE_CLUSTER,
        True,
        "reachable",
    )
    assert here["slurm_version"] == "24.11.5"
    assert there["name"] == OTHER and there["state"] == "unreachable"
    assert there["slurm_version"] is None and "not responding" in there["detail"]
    assert (there["num_nodes"], there["num_healthy"], there["free_gpus"]) == (1, 1, 0)
    assert there["spare_target"] == 1  # the file's, until an admin sets one
    assert here["num_spares"] >= 1 and here["free_gpus"] >= 8

    only_b = api.get("/v1/nodes", params={"cluster": OTHER}).json()
    assert [(n["cluster"], n["name"]) for n in only_b] == [(OTHER, "zz001")]
    shown = api.get("/v1/nodes/zz001", params={"cluster": OTHER}).json()
    assert (shown["cluster"], shown["slurm_state"]) == (OTHER, "IDLE+DRAIN")


@pytest.mark.usefixtures("two_clusters")
def test_the_cluster_list_says_since_when_a_cluster_is_silent(
    api: Any, db_session: Session
) -> None:
    with db_session.begin_nested():
        since = reachability.record_unreachable(
            db_session, OTHER, utcnow() - timedelta(minutes=3), "slurmctld not responding"
        )
    here, there = api.get("/v1/clusters").json()
    assert here["unreachable_since"] is None
    assert there["unreachable_since"].startswith(f"{since:%Y-%m-%dT%H:%M:%S}")


@pytest.mark.usefixtures("two_clusters")
def test_an_unknown_cluster_is_refused_naming_the_known_ones(api: Any) -> None:
    for response in (
        api.get("/v1/nodes", params={"cluster": "nowhere"}),
        api.get("/v1/runs", params={"cluster": "nowhere"}),
        api.post("/v1/runs", json=good_spec(cluster="nowhere")),
    ):
        assert response.status_code == 422, response.text
        body = response.json()
        assert body["error"] == "unknown_cluster"
        assert (
            "'nowhere'" in body["detail"] and f"{DEFAULT_FAKE_CLUSTER}, {OTHER}" in body["detail"]
        )


@pytest.mark.usefixtures("two_clusters")
def test_a_spec_pinned_to_either_cluster_runs_there(api: Any, db_session: Session) -> None:
    busy_default_nodes(db_session)
    for name in ("zz001", "zz002"):
        add_node(db_session, OTHER, name, NodeState.HEALTHY, slurm_state="IDLE")
    for cluster in (DEFAULT_FAKE_CLUSTER, OTHER):
        pinned = api.post("/v1/runs", json=good_spec(name=f"on-{cluster}", cluster=cluster))
        assert pinned.status_code == 201, pinned.text
        assert pinned.json()["cluster"] == cluster


@pytest.mark.usefixtures("two_clusters")
def test_a_pinned_cluster_too_small_for_the_spec_is_refused_naming_it(
    api: Any, db_session: Session
) -> None:
    add_node(db_session, OTHER, "zz001", NodeState.HEALTHY, slurm_state="IDLE")
    refused = api.post("/v1/runs", json=good_spec(name="big", cluster=OTHER, nodes=2))
    assert refused.status_code == 422, refused.text
    body = refused.json()
    assert body["error"] == "cluster_cannot_run"
    assert f"'{OTHER}'" in body["detail"] and "1 nodes, the spec asks for 2" in body["detail"]


@pytest.mark.usefixtures("two_clusters")
def test_a_pinned_cluster_without_a_layout_for_the_spec_is_refused_with_the_planners_why(
    api: Any, db_session: Session, monkeypatch: pytest.MonkeyPatch
) -> None:
    busy_default_nodes(db_session)
    configs = (
        ClusterConfig(name=DEFAULT_FAKE_CLUSTER, reach=ClusterReach.LOCAL),
        ClusterConfig(name=OTHER, hardware="a100-80gb"),  # no FP8 tensor cores
    )
    monkeypatch.setattr(registry, "clusters", lambda settings: configs)
    fp8 = good_spec(name="fp8", cluster=OTHER, parallelism={"precision": "fp8"})
    refused = api.post("/v1/runs/dry-run", json=fp8)
    assert refused.status_code == 422, refused.text
    assert refused.json()["error"] == "cluster_cannot_run"
    assert "a100-80gb" in refused.json()["detail"] and "fp8" in refused.json()["detail"]
    # Left to the service, the spec goes where it has a layout.
    chosen = api.post("/v1/runs/dry-run", json={**fp8, "cluster": None})
    assert chosen.status_code == 200, chosen.text
    decision = chosen.json()
    assert decision["cluster"] == DEFAULT_FAKE_CLUSTER
    rows = {row["name"]: row for row in decision["clusters"]}
    assert rows[OTHER]["unfit"] == "no_layout" and rows[DEFAULT_FAKE_CLUSTER]["chosen"]
    assert "only cluster" in decision["cluster_why"]


@pytest.mark.usefixtures("two_clusters")
def test_a_pinned_cluster_that_does_not_answer_is_refused_and_an_unpinned_run_avoids_it(
    api: Any, db_session: Session
) -> None:
    busy_default_nodes(db_session)
    with db_session.begin_nested():
        since = reachability.record_unreachable(
            db_session, OTHER, utcnow() - timedelta(minutes=3), "slurmctld not responding"
        )
    refused = api.post("/v1/runs", json=good_spec(name="there", cluster=OTHER))
    assert refused.status_code == 409, refused.text
    assert refused.json()["error"] == "cluster_unreachable"
    detail = refused.json()["detail"]
    assert f"'{OTHER}'" in detail and f"{since:%H:%M:%S}" in detail and "not responding" in detail
    anywhere = api.post("/v1/runs", json=good_spec(name="anywhere"))
    assert anywhere.status_code == 201, anywhere.text
    assert anywhere.json()["cluster"] == DEFAULT_FAKE_CLUSTER


@pytest.mark.usefixtures("two_clusters")
def test_the_dry_run_shows_each_clusters_plan_and_why_the_chosen_one_won(
    api: Any, db_session: Session
) -> None:
    # The other cluster has the free nodes, the default none: the run can start there now.
    # Three free: one goes to its spare pool first (its target is 1, it holds none).
    for name in ("zz001", "zz002", "zz003"):
        add_node(db_session, OTHER, name, NodeState.HEALTHY, slurm_state="IDLE")
    busy_default_nodes(db_session)
    decided = api.post("/v1/runs/dry-run", json=good_spec(name="where", nodes=2))
    assert decided.status_code == 200, decided.text
    body = decided.json()
    names = [row["name"] for row in body["clusters"]]
    assert names == [DEFAULT_FAKE_CLUSTER, OTHER]
    rows = {row["name"]: row for row in body["clusters"]}
    assert rows[OTHER]["starts_now"] and rows[OTHER]["free_nodes"] == 2
    assert rows[OTHER]["step_time_s"] > 0 and rows[OTHER]["time_per_step_s"] > 0
    assert not rows[DEFAULT_FAKE_CLUSTER]["starts_now"]
    assert body["cluster"] == OTHER and rows[OTHER]["chosen"]
    assert "can start now" in body["cluster_why"]


def test_runs_are_listed_by_cluster(api: Any, db_session: Session) -> None:
    ours = add_run(db_session, name="ours")
    listed = api.get("/v1/runs", params={"cluster": DEFAULT_FAKE_CLUSTER, "limit": 500}).json()
    assert ours.id in [r["id"] for r in listed["items"]]
    assert {r["cluster"] for r in listed["items"]} == {DEFAULT_FAKE_CLUSTER}


def test_one_cluster_configured_changes_nothing_for_a_spec(api: Any) -> None:
    response = api.post("/v1/runs", json=good_spec(name="plain"))
    assert response.status_code == 201, response.text
    assert response.json()["cluster"] == DEFAULT_FAKE_CLUSTER
