"""The doctor per cluster (client/doctor/site.py::check_clusters): each further cluster the
service drives, reachable or since when not, from GET /v1/clusters as the service answers
it; nothing on a site of one cluster or when the service does not answer (the agents area
reports that)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from client.api import ApiError
from client.doctor.result import Area, SiteSettings, Status
from client.doctor.site import check_clusters

SETTINGS = SiteSettings(
    service_url="https://127.0.0.1:8000",
    database_url="postgresql://x",
    slurm_conf=None,
    partition="train",
    checkpoint_root=Path("/tmp"),
)


def cluster(name: str, reachable: bool, **fields: Any) -> dict[str, Any]:
    return {
        "name": name,
        "state": "reachable" if reachable else "unreachable",
        "slurm_version": "22.05.8" if reachable else None,
        "num_nodes": 8,
        "num_healthy": 7,
        "detail": "" if reachable else "slurmctld not responding",
        "unreachable_since": None if reachable else "2026-12-06T18:00:05.123+00:00",
        **fields,
    }


class Answers:
    """What the service's cluster list answers (or the error it raises)."""

    def __init__(self, clusters: list[dict[str, Any]] | ApiError) -> None:
        self.clusters = clusters

    def list_clusters(self) -> list[dict[str, Any]]:
        if isinstance(self.clusters, ApiError):
            raise self.clusters
        return self.clusters


def test_each_cluster_is_checked_and_a_silent_one_says_since_when() -> None:
    answers = Answers([cluster("runyard-dev", True), cluster("runyard-dev-b", False)])
    here, there = check_clusters(SETTINGS, answers)  # type: ignore[arg-type]
    assert (here.area, here.name, here.status) == (Area.SLURM, "cluster runyard-dev", Status.OK)
    assert "Slurm 22.05.8" in here.detail and "7/8 nodes healthy" in here.detail
    assert (there.name, there.status) == ("cluster runyard-dev-b", Status.FAIL)
    assert "since 2026-12-06 18:00:05 UTC" in there.detail and "not responding" in there.detail
    assert there.fix and "sinfo -M runyard-dev-b" in there.fix


def test_one_cluster_or_a_silent_service_adds_nothing() -> None:
    assert check_clusters(SETTINGS, Answers([cluster("runyard-dev", True)])) == []  # type: ignore[arg-type]
    refused = Answers(ApiError("cannot reach the runyard service", status=None))
    assert check_clusters(SETTINGS, refused) == []  # type: ignore[arg-type]
