"""The clusters the service drives, as configured, and each one's state as Slurm answers.

The one place that turns the settings into the list of clusters (the clusters file, or the
site's one cluster when there is none) and says which is the default. Everything that
names a cluster (a spec's `cluster:`, a `--cluster` filter, an agent's heartbeat) is
checked here; `probe_clusters` is what the cluster list shows and what failover between
clusters (the next stage of issue 41) will watch.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path

from service.config import Settings
from service.config_areas.clusters import (
    SITE_FIELDS,
    ClusterConfig,
    ClusterReach,
    read_clusters_file,
)
from service.errors import AppError
from service.slurm.cluster_info import local_cluster_name, show_config
from service.slurm.commands import SlurmError
from service.slurm.target import SlurmTarget


class UnknownCluster(AppError):
    """A request names a cluster the service does not drive."""

    status_code = 422
    code = "unknown_cluster"

    def __init__(self, name: str, known: Sequence[str]) -> None:
        super().__init__(
            f"unknown cluster {name!r}: the service drives {', '.join(known)} "
            "(`runyard cluster list`)"
        )
        self.name = name


class ClusterState(StrEnum):
    REACHABLE = "reachable"  # its slurmctld answered `scontrol show config`
    UNREACHABLE = "unreachable"  # it did not, or not in time


@dataclass(frozen=True)
class ClusterProbe:
    """A configured cluster and what its controller answered just now."""

    config: ClusterConfig
    state: ClusterState
    slurm_version: str | None  # slurmctld's, None when unreachable
    detail: str = ""  # why unreachable: Slurm's own words


def clusters(settings: Settings) -> tuple[ClusterConfig, ...]:
    """Every cluster the service drives, the default one first."""
    site = {field: getattr(settings, field) for field in SITE_FIELDS}
    key = tuple(sorted(site.items()))
    return _resolve(settings.clusters_file, settings.cluster_name, settings.slurm_conf, key)


@functools.cache
def _resolve(
    clusters_file: Path | None,
    cluster_name: str | None,
    slurm_conf: Path | None,
    site: tuple[tuple[str, str], ...],
) -> tuple[ClusterConfig, ...]:
    # Read once per process: the file's errors surface at the first use (the service's
    # start), and the local ClusterName cannot change under a running service's rows.
    if clusters_file is not None:
        return read_clusters_file(clusters_file, dict(site))
    name = cluster_name or local_cluster_name(slurm_conf)
    return (
        ClusterConfig.model_validate({"name": name, "reach": ClusterReach.LOCAL, **dict(site)}),
    )


def default_cluster(settings: Settings) -> ClusterConfig:
    """Where a run that names no cluster goes, and an agent that says none is."""
    return clusters(settings)[0]


def cluster_names(settings: Settings) -> list[str]:
    return [c.name for c in clusters(settings)]


def find_cluster(settings: Settings, name: str | None) -> ClusterConfig:
    """The cluster named `name` (None: the default one); UnknownCluster (422) naming it and
    the known ones when the service does not drive it."""
    if name is None:
        return default_cluster(settings)
    for config in clusters(settings):
        if config.name == name:
            return config
    raise UnknownCluster(name, cluster_names(settings))


def planning_settings(settings: Settings, config: ClusterConfig) -> Settings:
    """The settings a run on `config` is planned with: the site's, with the cluster's
    hardware, network, accelerator and partition (what the planner and sbatch read)."""
    update = {field: getattr(config, field) for field in SITE_FIELDS}
    if all(getattr(settings, field) == value for field, value in update.items()):
        return settings  # the site's own cluster: nothing to copy
    return settings.model_copy(update=update)


def target_of(settings: Settings, config: ClusterConfig) -> SlurmTarget:
    """How the service's commands reach `config`'s controller."""
    return SlurmTarget.of(config, settings.slurm_conf)


def probe(settings: Settings, config: ClusterConfig) -> ClusterProbe:
    """Ask one cluster's controller for its name and version. A network call: never with
    a database transaction open."""
    try:
        info = show_config(target_of(settings, config))
    except SlurmError as exc:
        return ClusterProbe(config, ClusterState.UNREACHABLE, None, str(exc)[:300])
    return ClusterProbe(config, ClusterState.REACHABLE, info.version or None)


def probe_clusters(settings: Settings) -> list[ClusterProbe]:
    """Every configured cluster with its state, asked in parallel (one silent controller
    costs the list its timeout once, not once per cluster), in the configured order."""
    configured = clusters(settings)
    with ThreadPoolExecutor(max_workers=min(8, len(configured))) as pool:
        return list(pool.map(lambda c: probe(settings, c), configured))
