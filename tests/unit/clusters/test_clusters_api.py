"""GET /v1/clusters, the `cluster` filters, a spec's `cluster:` and an agent's cluster,
on the real API and Postgres. Two clusters are configured by replacing the registry's list
(the file's own parsing is tested in test_cluster_config.py); their controllers by
replacing the probe."""

from __future__ import annotations

from typing import Any

import pytest
from sqlalchemy.orm import Session

from service.clusters import registry
from service.config_areas.clusters import ClusterConfig, ClusterReach
from service.models import Node, NodeState
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
def test_a_spec_pins_the_default_cluster_and_is_told_the_other_is_not_driven_yet(
    api: Any,
) -> None:
    pinned = api.post("/v1/runs", json=good_spec(name="pinned", cluster=DEFAULT_FAKE_CLUSTER))
    assert pinned.status_code == 201, pinned.text
    assert pinned.json()["cluster"] == DEFAULT_FAKE_CLUSTER
    elsewhere = api.post("/v1/runs", json=good_spec(name="elsewhere", cluster=OTHER))
    assert elsewhere.status_code == 422
    assert elsewhere.json()["error"] == "cluster_not_driven"
    assert OTHER in elsewhere.json()["detail"]


def test_runs_are_listed_by_cluster(api: Any, db_session: Session) -> None:
    ours = add_run(db_session, name="ours")
    listed = api.get("/v1/runs", params={"cluster": DEFAULT_FAKE_CLUSTER, "limit": 500}).json()
    assert ours.id in [r["id"] for r in listed["items"]]
    assert {r["cluster"] for r in listed["items"]} == {DEFAULT_FAKE_CLUSTER}


def test_one_cluster_configured_changes_nothing_for_a_spec(api: Any) -> None:
    response = api.post("/v1/runs", json=good_spec(name="plain"))
    assert response.status_code == 201, response.text
    assert response.json()["cluster"] == DEFAULT_FAKE_CLUSTER
