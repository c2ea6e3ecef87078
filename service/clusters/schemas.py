"""Clusters as the API shows them."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from service.clusters.registry import ClusterState
from service.config_areas.clusters import ClusterReach


class ClusterOut(BaseModel):
    """One configured cluster: what its controller answered just now, and its nodes as
    runyard keeps them."""

    name: str = Field(description="Slurm's ClusterName.")
    default: bool = Field(description="Where runs that name no cluster go.")
    reach: ClusterReach = Field(description="How the service reaches its slurmctld.")
    state: ClusterState = Field(description="Whether its slurmctld answered just now.")
    slurm_version: str | None = Field(description="slurmctld's version; None: unreachable.")
    detail: str = Field(default="", description="Why unreachable, in Slurm's words.")
    unreachable_since: datetime | None = Field(
        default=None,
        description="Since when the reconciler has had no answer from its slurmctld (None: "
        "it answered the last read); runs wait this long before they fail over.",
    )
    partition: str
    hardware: str
    num_nodes: int = Field(description="Nodes runyard knows on it.")
    num_healthy: int = Field(description="Of them, HEALTHY in runyard's eyes.")
    num_spares: int = Field(description="Nodes held in its spare pool now.")
    spare_target: int = Field(description="The spare pool's target size.")
    free_gpus: int = Field(description="GPUs of healthy nodes Slurm has idle, spares aside.")
