"""Render slurm_templates/ into a dev cluster's state folder (pure: no processes)."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

import jinja2

TEMPLATES_DIR = Path(__file__).resolve().parents[2] / "slurm_templates"
FIRST_SLURMD_PORT = 17001  # one port per slurmd; slurmctld listens on CONTROLLER_PORT
CONTROLLER_PORT = 16817
DBD_PORT = 16819  # slurmdbd, when the dev cluster has accounting (Slurm's default is 6819)
MARIADB_PORT = 16306  # the dev cluster's own MariaDB for slurmdbd (MariaDB's default 3306)
SLURMD_PORT = 6818  # Slurm's default, where each node is a host of its own
PARTITION = "train"
# Slurm's ClusterName of the dev cluster (what `sbatch -M` and sacct's records name); the
# further clusters of `dev up --clusters` add a letter: runyard-dev-b.
CLUSTER_NAME = "runyard-dev"
# The product's largest cluster (1,280 nodes of 8 GPUs). What one machine holds is less:
# `runyard dev up` checks the memory the daemons and agents need (cluster.py).
MAX_NODES = 1280


def node_name(index: int) -> str:
    """gpu001, gpu002, ... (1-based, as on real clusters)."""
    return f"gpu{index:03d}"


def hostlist(first: int, last: int) -> str:
    """Slurm's compressed form of a contiguous node range: gpu[001-004]."""
    if first == last:
        return node_name(first)
    return f"gpu[{first:03d}-{last:03d}]"


@dataclass(frozen=True)
class Leaf:
    name: str
    nodes: str
    members: tuple[str, ...]


@dataclass(frozen=True)
class ClusterShape:
    """What `runyard dev up` was asked for."""

    num_nodes: int = 8
    leaf_size: int = 4
    gpus_per_node: int = 8
    cpus_per_node: int = 8
    memory_mb_per_node: int = 16000

    def __post_init__(self) -> None:
        if not 1 <= self.num_nodes <= MAX_NODES:
            raise ValueError(f"--nodes must be between 1 and {MAX_NODES}, got {self.num_nodes}")
        if not 1 <= self.leaf_size <= self.num_nodes:
            raise ValueError(
                f"--leaf-size must be between 1 and --nodes ({self.num_nodes}), "
                f"got {self.leaf_size}"
            )

    @property
    def node_names(self) -> list[str]:
        return [node_name(i) for i in range(1, self.num_nodes + 1)]

    @property
    def leaves(self) -> list[Leaf]:
        leaves = []
        for n, start in enumerate(range(1, self.num_nodes + 1, self.leaf_size), start=1):
            end = min(start + self.leaf_size - 1, self.num_nodes)
            members = tuple(node_name(i) for i in range(start, end + 1))
            leaves.append(Leaf(f"leaf{n}", hostlist(start, end), members))
        return leaves

    def port_of(self, node: str) -> int:
        return FIRST_SLURMD_PORT + self.node_names.index(node)


@dataclass(frozen=True)
class Network:
    """How slurmctld and the slurmd daemons find each other."""

    cluster_name: str
    controller_host: str
    controller_addr: str | None  # None: resolve controller_host by name
    node_hostname: str | None  # None: every node is its own host, named as its NodeName
    node_addr: str | None
    port_range: str | int  # slurmd ports: one per node on one box, or Slurm's 6818 for all
    slurmd_timeout_s: int
    controller_port: int = CONTROLLER_PORT


def one_box(
    shape: ClusterShape,
    *,
    cluster_name: str = CLUSTER_NAME,
    first_slurmd_port: int = FIRST_SLURMD_PORT,
    controller_port: int = CONTROLLER_PORT,
) -> Network:
    """The dev cluster: every slurmd on this machine, told apart by port. Another name and
    other ports give a second cluster beside it (bench/devcluster_scale.py)."""
    last_port = first_slurmd_port + shape.num_nodes - 1
    return Network(
        cluster_name=cluster_name,
        controller_host=socket.gethostname().split(".")[0],
        controller_addr="127.0.0.1",
        node_hostname="localhost",
        node_addr="127.0.0.1",
        port_range=f"{first_slurmd_port}-{last_port}" if shape.num_nodes > 1 else last_port,
        slurmd_timeout_s=10,
        controller_port=controller_port,
    )


def containers(controller: str = "slurmctld") -> Network:
    """docker-compose: one container per node, each reached by its name on the network."""
    return Network(
        cluster_name="runyard-compose",
        controller_host=controller,
        controller_addr=None,
        node_hostname=None,
        node_addr=None,
        port_range=SLURMD_PORT,
        slurmd_timeout_s=30,
    )


def block_sizes(shape: ClusterShape) -> list[int]:
    """topology/block's BlockSizes: the base block, then each power-of-two multiple of it
    the cluster holds (Slurm wants each a power of two above the one before,
    topology.conf(5)); a job without --segment fits one aligned block of these sizes."""
    sizes = [shape.leaf_size]
    while sizes[-1] * 2 <= shape.num_nodes:
        sizes.append(sizes[-1] * 2)
    return sizes


def render(
    shape: ClusterShape,
    state_dir: Path,
    munge_socket: str | None = None,
    network: Network | None = None,
    accounting: bool = False,
    topology: str = "tree",
    port_offset: int = 0,
    shared_dbd_port: int | None = None,
) -> dict[str, str]:
    """The config files, by file name, for a cluster rooted at `state_dir`: slurm.conf,
    topology.conf, gres.conf, and slurmdbd.conf with `accounting`. `topology` "block"
    describes the leaves as topology/block's blocks (Slurm 24.05+); `port_offset` moves
    slurmdbd's and MariaDB's ports, for a second cluster beside the first.

    `shared_dbd_port` is another cluster's slurmdbd, which this one registers with instead
    of running its own (a further cluster of `dev up --clusters`, in Slurm's multi-cluster
    operation): slurm.conf points there and no slurmdbd.conf is rendered."""
    net = network or one_box(shape)
    own_dbd_port = DBD_PORT + port_offset
    if shared_dbd_port is not None:
        dbd_port: int | None = shared_dbd_port
    else:
        dbd_port = own_dbd_port if accounting else None
    if topology == "block" and shape.num_nodes % shape.leaf_size:
        raise ValueError(
            f"--nodes {shape.num_nodes}: topology/block wants whole blocks, a multiple of "
            f"--leaf-size {shape.leaf_size}"
        )
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES_DIR),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    leaves = shape.leaves
    common = {
        "node_range": hostlist(1, shape.num_nodes),
        "gpus_per_node": shape.gpus_per_node,
    }
    slurm_conf = env.get_template("slurm.conf.j2").render(
        **common,
        cluster_name=net.cluster_name,
        controller_host=net.controller_host,
        controller_addr=net.controller_addr,
        controller_port=net.controller_port,
        slurm_user="root",
        munge_socket=munge_socket,
        state_dir=str(state_dir),
        min_job_age_s=3600,
        slurmd_timeout_s=net.slurmd_timeout_s,
        prolog=None,
        epilog=None,
        node_hostname=net.node_hostname,
        node_addr=net.node_addr,
        port_range=net.port_range,
        cpus_per_node=shape.cpus_per_node,
        memory_mb_per_node=shape.memory_mb_per_node,
        partition=PARTITION,
        max_time="INFINITE",
        dbd_port=dbd_port,
        topology=topology,
    )
    topology_conf = env.get_template("topology.conf.j2").render(
        leaf_size=shape.leaf_size,
        leaves=leaves,
        spine="spine",
        leaf_names=",".join(leaf.name for leaf in leaves),
        topology=topology,
        block_sizes=",".join(map(str, block_sizes(shape))),
    )
    gres_conf = env.get_template("gres.conf.j2").render(**common, device_dir=str(state_dir / "dev"))
    files = {"slurm.conf": slurm_conf, "topology.conf": topology_conf, "gres.conf": gres_conf}
    if accounting and shared_dbd_port is None:
        files["slurmdbd.conf"] = env.get_template("slurmdbd.conf.j2").render(
            dbd_port=own_dbd_port,
            storage_port=MARIADB_PORT + port_offset,
            slurm_user="root",
            state_dir=str(state_dir),
        )
    return files
