"""clusters: every node, node event, run, attempt and incident names its Slurm cluster

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06 15:00:00.000000

One service drives several Slurm clusters (issue 41), and Slurm keeps nodes, job ids and
reservations per cluster: two clusters may both have a gpu001 and a job 1234. A node is
therefore (cluster, name), and a node event points at its node by both. A run's cluster is
where its reservation and held nodes are, an attempt's where its job was submitted, an
incident's where its node (or run) is.

Existing rows get the name the service gives its default cluster at the time of the
upgrade (service/clusters/registry.py: the first of RUNYARD_CLUSTERS_FILE, else
RUNYARD_CLUSTER_NAME, else the ClusterName of the local slurm.conf, else `default`): they
were all made on the one cluster the service drove. The spare pool's target and the
topology kind, kept in cluster_settings, become that cluster's. The server default is dropped after
the fill, so that no row made later can be on a cluster by omission.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from service.clusters.registry import default_cluster
from service.config import Settings

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("nodes", "node_events", "runs", "attempts", "incidents")
INDEXED = ("runs", "attempts")


def upgrade() -> None:
    name = default_cluster(Settings()).name
    for table in TABLES:
        op.add_column(
            table, sa.Column("cluster", sa.String(64), server_default=name, nullable=False)
        )
        op.alter_column(table, "cluster", server_default=None)
    for table in INDEXED:
        op.create_index(op.f(f"ix_{table}_cluster"), table, ["cluster"])
    op.drop_constraint("fk_node_events_node_name_nodes", "node_events", type_="foreignkey")
    op.drop_constraint("pk_nodes", "nodes", type_="primary")
    op.create_primary_key("pk_nodes", "nodes", ["cluster", "name"])
    op.create_foreign_key(
        "fk_node_events_cluster_nodes", "node_events", "nodes",
        ["cluster", "node_name"], ["cluster", "name"], ondelete="CASCADE",
    )  # fmt: skip
    # The spare pool's target and the topology kind were the one cluster's: now per cluster.
    op.execute(
        sa.text(
            "UPDATE cluster_settings SET key = key || ':' || :name "
            "WHERE key IN ('spare_pool_target', 'slurm_topology')"
        ).bindparams(name=name)
    )


def downgrade() -> None:
    # Only a database of one cluster goes back: names must be unique again.
    op.execute(
        "UPDATE cluster_settings SET key = split_part(key, ':', 1) "
        "WHERE key LIKE 'spare_pool_target:%' OR key LIKE 'slurm_topology:%'"
    )
    op.drop_constraint("fk_node_events_cluster_nodes", "node_events", type_="foreignkey")
    op.drop_constraint("pk_nodes", "nodes", type_="primary")
    op.create_primary_key("pk_nodes", "nodes", ["name"])
    op.create_foreign_key(
        "fk_node_events_node_name_nodes", "node_events", "nodes",
        ["node_name"], ["name"], ondelete="CASCADE",
    )  # fmt: skip
    for table in INDEXED:
        op.drop_index(op.f(f"ix_{table}_cluster"), table_name=table)
    for table in TABLES:
        op.drop_column(table, "cluster")
