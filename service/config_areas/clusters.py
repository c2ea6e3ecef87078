"""The Slurm clusters one service drives: the site's list, read from a TOML file.

A site with one cluster configures nothing: the service drives the Slurm its environment
reaches (the cluster area's slurm_conf, else Slurm's default), as it always has. A site
with several lists them in the file RUNYARD_CLUSTERS_FILE names, one `[[cluster]]` table
each:

    [[cluster]]
    name = "runyard-dev"           # Slurm's ClusterName
    reach = "local"                # the Slurm this service's environment reaches
    hardware = "h100-sxm"

    [[cluster]]
    name = "runyard-dev-b"
    reach = "multicluster"         # `-M runyard-dev-b` through the shared slurmdbd
    spare_pool_target = 2
    mounts = ["/shared"]           # a run moves here only with its checkpoint under these

A file rather than one variable per field: a cluster is a record of several fields, and
TOML is what a Slurm admin reads at a glance (a JSON list in one environment variable is
not). The first cluster is the default one: runs that name none, and agents that say none,
are on it. Fields a table leaves out take the site's value of the same name (the cluster
area: partition, hardware, network, accelerator), so a file of names alone describes
clusters alike.
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from service.config_areas.base import AreaSettings

# Slurm lower-cases ClusterName and uses it in file and table names (slurm.conf(5)); a
# name outside these characters would not survive the round trip through sacct/-M.
CLUSTER_NAME_PATTERN = r"^[a-z0-9][a-z0-9_.-]{0,63}$"

# The fields a cluster's table may leave out to take the site's value of the same name.
SITE_FIELDS = ("partition", "hardware", "network", "accelerator")


class ClusterReach(StrEnum):
    """How the service's Slurm commands reach a cluster's slurmctld."""

    LOCAL = "local"  # the Slurm this service's environment reaches (the site slurm_conf)
    # Slurm's multi-cluster operation: `-M <name>` on every command, from the local
    # cluster's SLURM_CONF, the shared slurmdbd telling the client where its controller is.
    MULTICLUSTER = "multicluster"
    SLURM_CONF = "slurm_conf"  # a slurm.conf of its own, given as SLURM_CONF


class TopologySource(StrEnum):
    """Where a cluster's network topology comes from."""

    SLURM = "slurm"  # `scontrol show topology` (topology/tree or topology/block)
    FLAT = "flat"  # none: every node alike (a cluster without a topology plugin)


class ClusterConfig(BaseModel):
    """One Slurm cluster the service drives."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(pattern=CLUSTER_NAME_PATTERN, description="Slurm's ClusterName.")
    reach: ClusterReach = Field(
        default=ClusterReach.MULTICLUSTER,
        description="How its slurmctld is reached: local, multicluster (-M) or slurm_conf.",
    )
    slurm_conf: Path | None = Field(
        default=None,
        description="Its slurm.conf (reach = slurm_conf only; local takes the site's).",
    )
    partition: str = Field(default="train", description="Partition runs are submitted to.")
    hardware: str = Field(default="h100-sxm", description="GPU type, for the planner.")
    network: str = Field(default="ib", description="ib or efa, for the planner.")
    accelerator: str = Field(default="gpu", pattern="^(gpu|cpu)$", description="gpu or cpu.")
    topology: TopologySource = Field(
        default=TopologySource.SLURM, description="Where its network topology comes from."
    )
    spare_pool_target: int | None = Field(
        default=None,
        ge=0,
        description="Spare nodes held on it until an admin sets the pool (None: the admin's "
        "target, `runyard admin spares`).",
    )

    mounts: tuple[Path, ...] | None = Field(
        default=None,
        description="Folders its nodes mount, at the same paths, from the filesystem that "
        "holds runs' folders and checkpoints (None: all of it, one shared filesystem). A run "
        "fails over to it only if its last trusted checkpoint lies under one of them.",
    )

    @model_validator(mode="after")
    def _mounts_are_absolute(self) -> ClusterConfig:
        relative = [str(m) for m in self.mounts or () if not m.is_absolute()]
        if relative:
            raise ValueError(f"mounts: {relative[0]} is not an absolute path")
        return self

    def mounts_path(self, path: Path) -> bool:
        """Whether its nodes see `path` (a checkpoint's folder) where the service does."""
        if self.mounts is None:
            return True
        return any(path == m or path.is_relative_to(m) for m in self.mounts)

    @model_validator(mode="after")
    def _slurm_conf_matches_reach(self) -> ClusterConfig:
        if self.reach is ClusterReach.SLURM_CONF and self.slurm_conf is None:
            raise ValueError("reach = slurm_conf needs slurm_conf (the path of its slurm.conf)")
        if self.reach is not ClusterReach.SLURM_CONF and self.slurm_conf is not None:
            raise ValueError(f"slurm_conf is for reach = slurm_conf, not {self.reach.value}")
        return self


class ClustersFileError(ValueError):
    """The clusters file cannot be read or says something the service cannot use; the
    message names the file and the field."""


class ClustersSettings(AreaSettings):
    """Clusters.

    Which Slurm clusters the service drives when there is more than one: a TOML file of
    `[[cluster]]` tables (name, reach, slurm_conf, partition, hardware, network,
    accelerator, topology, spare_pool_target, mounts; service/config_areas/clusters.py). Unset: one
    cluster, the Slurm the cluster area reaches, named by its slurm.conf's ClusterName."""

    clusters_file: Path | None = Field(
        default=None,
        description="TOML file listing the clusters, the default one first (None: one "
        "cluster, the local Slurm, named by its ClusterName, else `default`).",
    )


def _where(loc: tuple[int | str, ...]) -> str:
    """`cluster[1].reach` for pydantic's ('cluster', 1, 'reach')."""
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def parse_clusters(doc: Mapping[str, Any], site: Mapping[str, Any]) -> tuple[ClusterConfig, ...]:
    """The clusters a parsed file lists, each field it leaves out taken from `site` (the
    site's settings of the same names). Raises ClustersFileError naming the field."""
    unknown = sorted(set(doc) - {"cluster"})
    if unknown:
        raise ClustersFileError(f"{unknown[0]}: unknown table (the file holds [[cluster]] tables)")
    tables = doc.get("cluster")
    if not isinstance(tables, list) or not tables:
        raise ClustersFileError("cluster: no [[cluster]] table (list at least one)")
    clusters: list[ClusterConfig] = []
    for i, table in enumerate(tables):
        values = {field: site[field] for field in SITE_FIELDS if field in site} | dict(table)
        try:
            clusters.append(ClusterConfig.model_validate(values))
        except ValidationError as exc:
            error = exc.errors()[0]
            where = _where(("cluster", i, *error["loc"]))
            raise ClustersFileError(f"{where}: {error['msg']}") from None
    names = [c.name for c in clusters]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise ClustersFileError(f"cluster.name: {repeated[0]} is listed twice")
    return tuple(clusters)


def read_clusters_file(path: Path, site: Mapping[str, Any]) -> tuple[ClusterConfig, ...]:
    """The clusters `path` lists (see parse_clusters); its errors name the file."""
    try:
        doc = tomllib.loads(path.read_text())
    except OSError as exc:
        raise ClustersFileError(f"RUNYARD_CLUSTERS_FILE {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ClustersFileError(f"RUNYARD_CLUSTERS_FILE {path}: not TOML: {exc}") from None
    try:
        return parse_clusters(doc, site)
    except ClustersFileError as exc:
        raise ClustersFileError(f"RUNYARD_CLUSTERS_FILE {path}: {exc}") from None
