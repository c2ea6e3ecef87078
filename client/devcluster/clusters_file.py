"""The service's clusters file for `runyard dev up --clusters N`: one `[[cluster]]` table per
dev cluster, as service/config_areas/clusters.py reads it (RUNYARD_CLUSTERS_FILE).

The first cluster is the service's own Slurm (`reach = "local"`, the SLURM_CONF the service
runs with); each further one is reached with `-M <name>` through the first's slurmdbd, as
Slurm's multi-cluster operation does. Every cluster trains on CPU in the dev partition; a
further cluster holds a spare of its own, so that recovery inside it has a node to move to.
Pure: `dev up` writes what `clusters_toml` returns (tests read it).
"""

from __future__ import annotations

from collections.abc import Sequence

from client.devcluster.render import PARTITION

# A further cluster's hot spares: one, as the demo holds on the first (`runyard spare set`).
MEMBER_SPARES = 1


def clusters_toml(names: Sequence[str]) -> str:
    """The file naming `names`, the first the service's local cluster."""
    tables = []
    for index, name in enumerate(names):
        lines = [
            "[[cluster]]",
            f'name = "{name}"',
            'reach = "local"' if index == 0 else 'reach = "multicluster"',
            f'partition = "{PARTITION}"',
            'accelerator = "cpu"',
        ]
        if index > 0:
            lines.append(f"spare_pool_target = {MEMBER_SPARES}")
        tables.append("\n".join(lines) + "\n")
    header = "# Written by `runyard dev up --clusters N`: the clusters one service drives.\n"
    return header + "\n" + "\n".join(tables)
