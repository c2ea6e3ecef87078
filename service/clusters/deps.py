"""How an API request names a cluster: `?cluster=NAME`, checked against the configured ones.

Left out, a request means the default cluster, as Slurm's own commands without -M mean the
local one; a name the service does not drive is a 422 naming it and the known ones.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import Query

from service.clusters.registry import find_cluster
from service.config import get_settings

ClusterQuery = Annotated[
    str | None,
    Query(description="Slurm ClusterName (default: the service's default cluster)."),
]


def cluster_name(name: str | None) -> str:
    """The cluster a request names (None: the default one); UnknownCluster (422) otherwise."""
    return find_cluster(get_settings(), name).name
