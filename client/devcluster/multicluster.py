"""`runyard dev up --clusters N`: further Slurm clusters beside the first, on this machine.

They use Slurm's own multi-cluster operation rather than anything of runyard's: each
further cluster runs a slurmctld and slurmds of its own (on ports MEMBER_PORT_OFFSET above
the first's, cluster.py) and registers with the first's slurmdbd, the one place where
Slurm's clients learn every cluster's controller. So from either cluster's SLURM_CONF,
`sbatch -M runyard-dev-b`, `squeue -M all` and `sacct -M runyard-dev-b` reach both.

Node names repeat across the clusters (each has gpu001...): Slurm keeps nodes per cluster,
and each slurmd is told apart by its port and its cluster's state folder, as a site's two
clusters may both have a node001. A further cluster runs no service or Postgres: one
runyard service drives every cluster, named in the clusters file the first cluster's `up`
wrote for it (clusters_file.py). Its nodes' health agents report to that service with
`--cluster <name>`, their kernel logs in the further cluster's state folder.
"""

from __future__ import annotations

from client.devcluster import accounting, identity
from client.devcluster.cluster import (
    DevCluster,
    Progress,
    agent_tokens,
    check_shape_unchanged,
    mint_tokens,
    saved_shape,
    start_agents,
    start_slurm,
    write_configs,
)
from client.devcluster.errors import DevClusterError
from client.devcluster.render import ClusterShape


def up_members(first: DevCluster, num_clusters: int, say: Progress = print) -> list[DevCluster]:
    """Bring up clusters 2..`num_clusters` beside `first` (already up, with its slurmdbd),
    each of the first's shape; parts already running are left as they are."""
    if num_clusters < 2:
        return []
    if not accounting.available():
        raise DevClusterError(
            f"--clusters {num_clusters} needs Slurm accounting, where the clusters meet: "
            "apt-get install slurmdbd mariadb-server (scripts/bootstrap.sh installs them)"
        )
    if not accounting.listening(first.dbd_port):
        raise DevClusterError(
            f"the first cluster's slurmdbd does not answer on port {first.dbd_port}: run "
            "`runyard dev up` first"
        )
    shape = saved_shape(first)
    if shape is None:
        raise DevClusterError(f"no dev cluster in {first.state_dir}: run `runyard dev up` first")
    members = [first.member_cluster(m) for m in range(2, num_clusters + 1)]
    for member in members:
        up_member(member, shape, say)
        if first.num_clusters >= member.member:  # the first's service drives it
            start_member_agents(first, member, shape, say)
    return members


def start_member_agents(
    first: DevCluster, member: DevCluster, shape: ClusterShape, say: Progress = print
) -> None:
    """Agent tokens for the further cluster's nodes, minted into the service's database,
    and an agent per node reporting with `--cluster` (cluster.start_agents)."""
    say(f"starting {member.cluster_name}'s health agents (--cluster {member.cluster_name})")
    table = member.table.load()
    missing = [n for n in shape.node_names if not member.agent_token_file(n).exists()]
    if missing:
        mint_tokens(first, agent_tokens(member, missing))
    start_agents(first, member, shape.node_names, table)
    member.table.save(table)


def up_member(member: DevCluster, shape: ClusterShape, say: Progress = print) -> None:
    """One further cluster: its configs (accounting on the first's slurmdbd), its row and
    the dev users' associations there, then its slurmctld and slurmds."""
    table = member.table.load()
    check_shape_unchanged(member, shape, table)
    changed = write_configs(member, shape, with_accounting=True)
    env = member.slurm_env()
    say(f"registering {member.cluster_name} and its users' accounts with the first's slurmdbd")
    # Before its slurmctld starts: it registers its address under this row, which is how
    # the other cluster's clients find it (`-M`).
    accounting.ensure_cluster_registered(member.cluster_name, env)
    identity.ensure_slurm_accounts(env, cluster=member.cluster_name)
    start_slurm(member, shape, table, changed, with_accounting=True, say=say)
    say(f"{member.cluster_name} up: {shape.num_nodes} nodes, state in {member.state_dir}")
