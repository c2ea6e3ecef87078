"""`runyard dev up|down|status`: a real multi-node Slurm cluster plus the service, on one box.

Everything started here is recorded by PID in `<state>/processes.json`, the daemon's own
PID (never a wrapper's: client/devcluster/processes.py, spawn); `down` stops exactly those
processes and nothing else (a munged that was already running is left alone).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import httpx
from runyard_client.tls import client_context

from client.dev_state import MAX_CLUSTERS, default_slurm_prefix, default_state_dir
from client.devcluster import accounting, identity, pg_instance, port_claim, postgres, tls
from client.devcluster.clusters_file import clusters_toml
from client.devcluster.errors import DevClusterError
from client.devcluster.paths import REPO_ROOT
from client.devcluster.port_claim import SERVICE_APP
from client.devcluster.processes import (
    ProcessTable,
    Started,
    environ_of,
    is_alive,
    spawn,
    stop,
    stop_together,
)
from client.devcluster.render import (
    CLUSTER_NAME,
    CONTROLLER_PORT,
    DBD_PORT,
    FIRST_SLURMD_PORT,
    PARTITION,
    ClusterShape,
    one_box,
    render,
)
from contract.slurm_features import SlurmFeature, SlurmVersion, features_of

SLURM_PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge", *accounting.ACCOUNTING_PACKAGES]
MUNGE_DIRS = [Path("/run/munge"), Path("/var/log/munge"), Path("/var/lib/munge")]

Progress = Callable[[str], None]

# What one node of the dev cluster costs this machine, measured on the 2-core, 24 GiB dev
# box (2026-12-03): an idle slurmd 9.3 MiB resident with 1,280 of them up
# (bench/devcluster_scale.py), an idle health agent 26 MiB (its PSS) and 0.3% of a core
# (7 s of CPU in 35 minutes). Up to 64 nodes always start (as before); above, `up` checks
# the machine: the agents may take half its cores, everything else keeps 4 GiB.
SLURMD_MIB, AGENT_MIB, AGENT_CORE_SHARE = 9.3, 26.0, 0.003
ALWAYS_ALLOWED_NODES = 64
HEADROOM_MIB = 4096
AGENTS_MAX_CORES_SHARE = 0.5
# A cluster on a Slurm prefix listens this far above the packaged one (slurmctld 17817,
# slurmd 18001..., slurmdbd 17819, MariaDB 17306, its Postgres 16432, the service 9000).
PREFIX_PORT_OFFSET = 1000
# Each further cluster of `dev up --clusters N` listens this far above the first (the
# second's slurmctld 18817, its slurmds 19001...): clear of a prefix cluster's 1000 above,
# and a prefix cluster's second (3000 above) clear of both.
MEMBER_PORT_OFFSET = 2000


def database_name(slurm_prefix: Path | None) -> str:
    """runyard; runyard_slurm_24_11 on /opt/slurm-24.11: the name is in the service's Slurm
    job names (runyard-<database>), which so differ between the two clusters."""
    if slurm_prefix is None:
        return "runyard"
    return "runyard_" + "".join(c if c.isalnum() else "_" for c in slurm_prefix.name)


def prefix_database_url(slurm_prefix: Path) -> str:
    """A cluster on a Slurm prefix keeps its runs and nodes in a Postgres of its own."""
    return DevCluster(default_state_dir(slurm_prefix), slurm_prefix=slurm_prefix).database_url


def default_service_port() -> int:
    return 8000 + (PREFIX_PORT_OFFSET if default_slurm_prefix() else 0)


def default_database_url() -> str:
    """The default dev cluster's database (its own Postgres): what the doctor checks when
    no RUNYARD_DATABASE_URL says otherwise."""
    return DevCluster(default_state_dir()).database_url


@dataclass(frozen=True)
class DevCluster:
    """Paths and settings of one dev cluster rooted at `state_dir`."""

    state_dir: Path
    # 8000 and the runyard database; 9000 and a database of its own on a Slurm prefix
    # (RUNYARD_DEV_SLURM), so a test session that restarts that cluster's service after it
    # finds the same port and database `dev up --slurm` gave it.
    service_port: int = field(default_factory=default_service_port)
    # Empty: the database on the cluster's own Postgres (own_database), which `up` starts;
    # a URL: that database instead, on a server someone else runs.
    database_url: str = ""
    replicas: int = 1  # service processes; more than one sit behind a proxy on service_port
    # A Slurm built into a prefix of its own (scripts/build_slurm.sh) instead of Debian's;
    # its binaries come first on the PATH of everything the cluster starts, and its daemons
    # listen PREFIX_PORT_OFFSET ports above the packaged cluster's, so both can run at once.
    slurm_prefix: Path | None = field(default_factory=default_slurm_prefix)
    # Which of the clusters of `dev up --clusters N` this is. The first (1) runs slurmdbd,
    # the service and its agents; each further one only a slurmctld and slurmds of its own,
    # in a state folder beside the first's, registered with the first's slurmdbd: Slurm's
    # multi-cluster operation, which `sbatch -M`, `squeue -M all` and `sacct -M` use.
    member: int = 1
    # Of the first: how many clusters its service drives (`dev up --clusters N`). Above
    # one, the service reads clusters_file, which names each (clusters_file.py).
    num_clusters: int = 1

    def __post_init__(self) -> None:
        if not 1 <= self.member <= MAX_CLUSTERS:
            raise ValueError(f"--clusters must be between 1 and {MAX_CLUSTERS}, got {self.member}")
        if not self.database_url:
            object.__setattr__(self, "database_url", self.own_database.url)

    @property
    def prefix_port_offset(self) -> int:
        """Where the first cluster's ports sit: 1000 above the packaged Slurm's on a prefix."""
        return 0 if self.slurm_prefix is None else PREFIX_PORT_OFFSET

    @property
    def port_offset(self) -> int:
        return self.prefix_port_offset + MEMBER_PORT_OFFSET * (self.member - 1)

    @property
    def cluster_name(self) -> str:
        """Slurm's ClusterName: runyard-dev for the first, runyard-dev-b for the second."""
        return CLUSTER_NAME if self.member == 1 else f"{CLUSTER_NAME}-{member_letter(self.member)}"

    @property
    def dbd_port(self) -> int:
        """The slurmdbd every member registers with: the first cluster's."""
        return DBD_PORT + self.prefix_port_offset

    def member_cluster(self, member: int) -> DevCluster:
        """The `member`th cluster beside this first one: its state folder is the first's
        name with the member's letter (.runyard/dev-b), its Slurm the first's."""
        if self.member != 1:
            raise ValueError(f"{self.cluster_name} is not the first cluster")
        if member == 1:
            return self
        folder = self.state_dir.with_name(f"{self.state_dir.name}-{member_letter(member)}")
        return replace(self, state_dir=folder, member=member)

    @property
    def member_numbers(self) -> range:
        """1 (this first cluster) up to the clusters its service drives."""
        return range(1, self.num_clusters + 1)

    def members_started(self) -> list[DevCluster]:
        """The further clusters `dev up --clusters` started beside this first one (those
        with a process table), for `dev down` and `dev status`."""
        if self.member != 1:
            return []
        members = [self.member_cluster(m) for m in range(2, MAX_CLUSTERS + 1)]
        return [m for m in members if m.table.path.exists()]

    @property
    def own_database(self) -> pg_instance.Instance:
        """The cluster's own Postgres, run by the service's user, and its database there."""
        return pg_instance.Instance(
            root=self.state_dir / "postgres",
            port=pg_instance.DEV_PORT + self.port_offset,
            owner=identity.SERVICE_USER,
            database=database_name(self.slurm_prefix),
            role=identity.SERVICE_USER,
            log=self.state_dir / "log" / "postgres.out",
        )

    @property
    def replica_ports(self) -> list[int]:
        """One replica listens on service_port itself; several on the ports above it."""
        if self.replicas == 1:
            return [self.service_port]
        return [self.service_port + i for i in range(1, self.replicas + 1)]

    def replica_key(self, index: int) -> str:
        """The replica's name in the process table ("service" when it is the only one)."""
        return "service" if self.replicas == 1 else f"service:{index + 1}"

    @property
    def slurm_conf(self) -> Path:
        return self.state_dir / "slurm.conf"

    @property
    def clusters_file(self) -> Path:
        """The service's RUNYARD_CLUSTERS_FILE, with more than one cluster."""
        return self.state_dir / "clusters.toml"

    @property
    def service_url(self) -> str:
        """HTTPS, verified with the cluster's own CA (tls.py), as a site serves it."""
        return f"https://127.0.0.1:{self.service_port}"

    @property
    def tls(self) -> tls.DevTls:
        return tls.DevTls(self.state_dir / "tls")

    @property
    def table(self) -> ProcessTable:
        return ProcessTable(self.state_dir / "processes.json")

    def kern_log(self, node: str) -> Path:
        """The file that plays a node's kernel log (tests append Xid lines to it)."""
        return self.state_dir / "nodes" / node / "kern.log"

    @property
    def admin_token_file(self) -> Path:
        """The dev cluster's admin token (mode 0600); the CLI uses it when RUNYARD_TOKEN is
        not set."""
        return self.state_dir / "admin.token"

    def user_token_file(self, user: str) -> Path:
        """A dev user's token (alice, bob), for trying runyard as them."""
        return self.state_dir / "users" / f"{user}.token"

    def agent_token_file(self, node: str) -> Path:
        return self.state_dir / "nodes" / node / "agent.token"

    def slurm_env(self) -> dict[str, str]:
        env = {**os.environ, "SLURM_CONF": str(self.slurm_conf)}
        if self.slurm_prefix is not None:
            bins = f"{self.slurm_prefix / 'bin'}:{self.slurm_prefix / 'sbin'}"
            env["PATH"] = f"{bins}:{env.get('PATH', '')}"
        return env

    def service_env(self, port: int | None = None) -> dict[str, str]:
        return {
            **self.slurm_env(),
            "RUNYARD_DATABASE_URL": self.database_url,
            "RUNYARD_PORT": str(port or self.service_port),
            # Workers and agents reach the service through its one address (the proxy's).
            "RUNYARD_PUBLIC_URL": self.service_url,
            # HTTPS with the dev CA's certificate; RUNYARD_CA, which the service hands to its
            # jobs, is what the agents, the workers and the CLI verify it with.
            **self.tls.service_settings(),
            "RUNYARD_STATE_DIR": str(self.state_dir),
            "RUNYARD_SLURM_CONF": str(self.slurm_conf),
            "RUNYARD_PARTITION": PARTITION,
            "RUNYARD_ACCELERATOR": "cpu",  # the dev cluster's ranks are CPU processes
            # Its services are the only ones acting on this cluster, whatever the shell says
            # (the test suite turns the reconciler off in its own process).
            "RUNYARD_RUN_RECONCILER": "true",
            "RUNYARD_ENVIRONMENT": "dev",  # hands RUNYARD_FAULT* to jobs (benches, demos)
            **({"RUNYARD_CLUSTERS_FILE": str(self.clusters_file)} if self.num_clusters > 1 else {}),
        }


def member_letter(member: int) -> str:
    """b for the second cluster, c for the third: the first is a, and unnamed."""
    return chr(ord("a") + member - 1)


def _run(argv: list[str], env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30)


def _wait(what: str, check: Callable[[], bool], timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise DevClusterError(f"{what} did not come up within {timeout_s:.0f} s")
        time.sleep(0.2)


def ensure_slurm_installed(say: Progress, slurm_prefix: Path | None = None) -> None:
    if slurm_prefix is not None and not (slurm_prefix / "sbin" / "slurmctld").exists():
        raise DevClusterError(
            f"no Slurm in {slurm_prefix}: build it with `scripts/build_slurm.sh {slurm_prefix}`"
        )
    if all(shutil.which(b) for b in ("slurmctld", "slurmd", "sbatch", "munged")):
        return
    say("installing Slurm and munge with apt-get")
    env = {"DEBIAN_FRONTEND": "noninteractive", "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}
    subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
    subprocess.run(["apt-get", "install", "-y", "-qq", *SLURM_PACKAGES], check=True, env=env)


def write_configs(cluster: DevCluster, shape: ClusterShape, with_accounting: bool) -> bool:
    """Render the configs; True if any of them changed."""
    state = cluster.state_dir
    for sub in ("slurmctld", "slurmd", "run", "log", "dev", "jobs", "checkpoints", "nodes"):
        (state / sub).mkdir(parents=True, exist_ok=True)
    changed = False
    files = configs_of(cluster, shape, with_accounting)
    for name, text in files.items():
        path = state / name
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
            changed = True
    for i in range(shape.gpus_per_node):
        device = state / "dev" / f"nvidia{i}"
        if not device.exists():
            # Character devices like the real /dev/nvidiaN (major 195): slurmd accepts them.
            os.mknod(device, 0o666 | 0o020000, os.makedev(195, i))
    for node in shape.node_names:
        cluster.kern_log(node).parent.mkdir(parents=True, exist_ok=True)
        cluster.kern_log(node).touch()
    (state / "shape.json").write_text(json.dumps(asdict(shape)))
    (state / "env.sh").write_text(env_script(cluster))
    return changed


def configs_of(cluster: DevCluster, shape: ClusterShape, with_accounting: bool) -> dict[str, str]:
    """The cluster's config files by name (render.py, on its ports and ClusterName). A
    further member of `--clusters` points its accounting at the first's slurmdbd and has
    no slurmdbd.conf of its own."""
    offset = cluster.port_offset
    network = one_box(
        shape,
        cluster_name=cluster.cluster_name,
        first_slurmd_port=FIRST_SLURMD_PORT + offset,
        controller_port=CONTROLLER_PORT + offset,
    )
    return render(
        shape,
        cluster.state_dir,
        network=network,
        accounting=with_accounting,
        topology=topology_of(cluster),
        port_offset=offset,
        shared_dbd_port=cluster.dbd_port if cluster.member > 1 else None,
    )


def env_script(cluster: DevCluster) -> str:
    """env.sh: the cluster's SLURM_CONF, and for the first the service's URL, CA and admin
    token; a further member has no service of its own (one service drives every cluster)."""
    lines = [f"export SLURM_CONF={cluster.slurm_conf}"]
    if cluster.member == 1:
        lines += [
            f"export RUNYARD_URL={cluster.service_url}",
            f"export RUNYARD_CA={cluster.tls.ca_cert}",
            f'export RUNYARD_TOKEN="$(cat {cluster.admin_token_file})"',
        ]
    if cluster.slurm_prefix:
        lines.append(f"export PATH={cluster.slurm_prefix}/bin:{cluster.slurm_prefix}/sbin:$PATH")
    return "".join(f"{line}\n" for line in lines)


def topology_of(cluster: DevCluster) -> str:
    """The topology plugin the dev cluster describes its leaves with: topology/block where
    its Slurm has it (a prefix's 24.11: the rack-scale description), else topology/tree
    (Debian 12's 22.05)."""
    if cluster.slurm_prefix is None:
        return "tree"
    # slurmctld -V, not scontrol: 24.11's client commands want a slurm.conf even for
    # --version, and this runs before the configs are written.
    out = _run([str(cluster.slurm_prefix / "sbin" / "slurmctld"), "-V"]).stdout
    version = SlurmVersion.parse(out)
    has_block = version is not None and SlurmFeature.TOPOLOGY_BLOCK in features_of(version)
    return "block" if has_block else "tree"


def saved_shape(cluster: DevCluster) -> ClusterShape | None:
    path = cluster.state_dir / "shape.json"
    return ClusterShape(**json.loads(path.read_text())) if path.exists() else None


def _ensure_munge(table: dict[str, Started], cluster: DevCluster) -> None:
    # Ask the daemon itself: a stopped munged can linger as a zombie that pgrep still lists
    # (containers whose PID 1 does not reap), and taking it for a live one leaves Slurm
    # without authentication.
    if _run(["munge", "-n"]).returncode == 0:
        return  # someone's munged already serves the default socket; not ours to manage
    for folder in MUNGE_DIRS:
        folder.mkdir(parents=True, exist_ok=True)
        shutil.chown(folder, "munge", "munge")
    if not Path("/etc/munge/munge.key").exists():
        subprocess.run(["mungekey", "--create"], check=True)
        shutil.chown("/etc/munge/munge.key", "munge", "munge")
    log = cluster.state_dir / "log" / "munged.out"
    table["munged"] = spawn("munged", ["munged", "--foreground"], log, user="munge")
    _wait("munged", lambda: Path("/run/munge/munge.socket.2").exists(), 10)


def node_limit(mem_available_mib: float, cores: int) -> int:
    """The most nodes (one slurmd and one agent each) this machine holds: by memory, and
    by the agents' CPU. 2 cores, 21 GiB available: min(501, 333) = 333."""
    by_memory = (mem_available_mib - HEADROOM_MIB) / (SLURMD_MIB + AGENT_MIB)
    by_cpu = AGENTS_MAX_CORES_SHARE * cores / AGENT_CORE_SHARE
    return max(ALWAYS_ALLOWED_NODES, int(min(by_memory, by_cpu)))


def _mem_available_mib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _check_machine(shape: ClusterShape, running: int) -> None:
    """Refuse a cluster this machine cannot hold (the nodes already up count as held)."""
    if shape.num_nodes <= ALWAYS_ALLOWED_NODES:
        return
    limit = node_limit(
        _mem_available_mib() + running * (SLURMD_MIB + AGENT_MIB), os.cpu_count() or 1
    )
    if shape.num_nodes > limit:
        raise DevClusterError(
            f"--nodes {shape.num_nodes}: this machine holds about {limit} dev nodes (each a "
            f"slurmd of ~{SLURMD_MIB:.0f} MiB and an agent of ~{AGENT_MIB:.0f} MiB and "
            f"{AGENT_CORE_SHARE:.1%} of a core); bench/devcluster_scale.py runs up to 1,280 "
            "slurmd without agents, bench/control_plane.py --nodes 1280 simulates the agents"
        )


def _nodes_ready(cluster: DevCluster, names: list[str]) -> bool:
    out = _run(["sinfo", "-h", "-N", "-o", "%N %T"], env=cluster.slurm_env())
    if out.returncode != 0:
        return False
    states = dict(line.split() for line in out.stdout.splitlines() if line.strip())
    bad = ("down", "unknown", "not_responding", "inval", "future")
    return all(n in states and not any(b in states[n] for b in bad) for n in names)


def up(
    num_nodes: int = 8,
    leaf_size: int | None = None,
    cluster: DevCluster | None = None,
    with_service: bool = True,
    say: Progress = print,
) -> DevCluster:
    """Bring every part up; parts already running are left as they are. The default leaf
    size is 4 (two leaf switches), 2 on topology/block: four blocks, so a run of two blocks
    leaves blocks with room for its replacement."""
    cluster = cluster or DevCluster(default_state_dir())
    default_leaf = 2 if topology_of(cluster) == "block" else 4
    shape = ClusterShape(num_nodes=num_nodes, leaf_size=leaf_size or default_leaf)
    ensure_slurm_installed(say, cluster.slurm_prefix)
    table = cluster.table.load()
    check_shape_unchanged(cluster, shape, table)
    running = sum(1 for n, p in table.items() if n.startswith("slurmd:") and is_alive(p))
    _check_machine(shape, running)
    with_accounting = accounting.available()
    changed = write_configs(cluster, shape, with_accounting)
    _ensure_munge(table, cluster)
    cluster.table.save(table)
    if with_accounting:
        say("making sure MariaDB and slurmdbd run (Slurm accounting)")
        accounting.ensure_running(
            cluster.state_dir, table, cluster.slurm_env(), _wait, cluster.port_offset
        )
        cluster.table.save(table)
        accounting.ensure_cluster_registered(cluster.cluster_name, cluster.slurm_env())
    start_slurm(cluster, shape, table, changed, with_accounting, say)

    say("making sure its users, their Slurm accounts and the service's sudoers rule exist")
    # The sudoers rule names the environment's bin/python3, as the service's gate does.
    opened = identity.ensure(
        cluster.state_dir,
        str(Path(sys.prefix) / "bin" / "python3"),
        cluster.slurm_env(),
        with_accounting,
    )
    for folder in opened:
        say(f"made {folder} searchable (o+x) so the dev users can run {sys.executable}")
    # Its own CA and the service's certificate (tls.py): the service's user exists now.
    tls.ensure(cluster.tls.folder, identity.SERVICE_USER)
    if with_service:
        if cluster.num_clusters > 1:  # read at the service's start: written before it
            names = [cluster.member_cluster(m).cluster_name for m in cluster.member_numbers]
            cluster.clusters_file.write_text(clusters_toml(names))
        _start_service(cluster, table, shape, say)
    say(f"dev cluster up: {num_nodes} nodes, state in {cluster.state_dir}")
    return cluster


def check_shape_unchanged(
    cluster: DevCluster, shape: ClusterShape, table: dict[str, Started]
) -> None:
    """Refuse another shape while the cluster's Slurm runs with the one it was given."""
    saved = saved_shape(cluster)
    slurm_running = any(is_alive(p) for n, p in table.items() if n.startswith("slurm"))
    if saved is not None and saved != shape and slurm_running:
        raise DevClusterError(
            f"the dev cluster in {cluster.state_dir} runs with {saved.num_nodes} nodes "
            f"(leaf size {saved.leaf_size}); run `runyard dev down` first to change its shape"
        )


def start_slurm(
    cluster: DevCluster,
    shape: ClusterShape,
    table: dict[str, Started],
    changed: bool,
    with_accounting: bool,
    say: Progress,
) -> None:
    """slurmctld (started, restarted or reconfigured as its configs `changed`), then one
    slurmd per node, waited for until every node registered; what runs is left running."""
    conf = str(cluster.slurm_conf)
    log_dir = cluster.state_dir / "log"
    if not (p := table.get("slurmctld")) or not is_alive(p):
        say(f"starting slurmctld ({cluster.cluster_name})")
        _start_slurmctld(cluster, table)
    elif changed and _accounting_changed(cluster, with_accounting):
        # slurmctld reads AccountingStorageType at start only; its saved state keeps the jobs.
        say("accounting changed: restarting slurmctld")
        stop(table["slurmctld"])
        _start_slurmctld(cluster, table)
    elif changed:
        say("configuration changed: scontrol reconfigure")
        _run(["scontrol", "reconfigure"], cluster.slurm_env())
    for node in shape.node_names:
        key = f"slurmd:{node}"
        if not (p := table.get(key)) or not is_alive(p):
            table[key] = spawn(
                key,
                ["slurmd", "-D", "-N", node, "-f", conf],
                log_dir / f"slurmd-{node}.out",
                env=cluster.slurm_env(),
            )
    cluster.table.save(table)
    say(f"waiting for {shape.num_nodes} slurmd nodes of {cluster.cluster_name} to register")
    _wait("the slurmd nodes", lambda: _nodes_ready(cluster, shape.node_names), 60)


def _start_slurmctld(cluster: DevCluster, table: dict[str, Started]) -> None:
    """slurmctld in the foreground (-D: the PID recorded is the daemon's), recorded, and
    waited for until it answers `scontrol ping`."""
    table["slurmctld"] = spawn(
        "slurmctld",
        ["slurmctld", "-D", "-f", str(cluster.slurm_conf)],
        cluster.state_dir / "log" / "slurmctld.out",
        env=cluster.slurm_env(),
    )
    cluster.table.save(table)
    _wait("slurmctld", lambda: _run(["scontrol", "ping"], cluster.slurm_env()).returncode == 0, 30)


def _accounting_changed(cluster: DevCluster, with_accounting: bool) -> bool:
    out = _run(["scontrol", "show", "config"], cluster.slurm_env()).stdout
    running = "accounting_storage/slurmdbd" in out
    return running != with_accounting


def service_argv() -> list[str]:
    """How the service is started (service/serve.py: on loopback, with the TLS and the port
    of its environment, service_env)."""
    return [sys.executable, "-m", SERVICE_APP]


def proxy_argv(listen: int, backends: list[int]) -> list[str]:
    """The proxy that gives several replicas one address (client/devcluster/proxy.py)."""
    argv = [sys.executable, "-m", "client.devcluster.proxy", "--listen", str(listen)]
    for port in backends:
        argv += ["--backend", str(port)]
    return argv


def _check_replica_count(cluster: DevCluster, table: dict[str, Started]) -> None:
    running = {n for n, p in table.items() if is_alive(p) and n.startswith(("service", "proxy"))}
    wanted = {cluster.replica_key(i) for i in range(cluster.replicas)}
    wanted |= {"proxy"} if cluster.replicas > 1 else set()
    if running - wanted:
        raise DevClusterError(
            f"the dev cluster runs {', '.join(sorted(running))}, not {cluster.replicas} "
            "replica(s); run `runyard dev down` first to change --replicas"
        )


def _healthy_at(url: str, ca: Path) -> Callable[[], bool]:
    return lambda: _service_healthy(url, ca)


def _service_healthy(url: str, ca: Path) -> bool:
    try:
        verify = client_context(str(ca))
        return httpx.get(f"{url}/healthz", timeout=1.0, verify=verify).status_code == 200
    except httpx.HTTPError:
        return False


def _stop_plain_http(cluster: DevCluster, table: dict[str, Started], say: Progress) -> None:
    """Services and agents started before the dev cluster served HTTPS (no RUNYARD_CA in
    their environment) are stopped, to start again over TLS below."""
    for name, proc in list(table.items()):
        if not name.startswith(("service", "agent:")) or not is_alive(proc):
            continue
        if environ_of(proc.pid).get("RUNYARD_CA") != str(cluster.tls.ca_cert):
            say(f"restarting {name} over HTTPS")
            stop(proc)
            del table[name]
    cluster.table.save(table)


def database_in_use(cluster: DevCluster, table: dict[str, Started], say: Progress) -> DevCluster:
    """The cluster as its running service has it: a service started before the dev cluster
    had a Postgres of its own keeps its database (and so do the replicas, agents' tokens and
    migrations of this `up`) until `runyard dev down && runyard dev up` moves it."""
    urls = {
        environ_of(proc.pid).get("RUNYARD_DATABASE_URL")
        for name, proc in table.items()
        if name.startswith("service") and is_alive(proc)
    }
    older = sorted(url for url in urls if url and url != cluster.database_url)
    if not older:
        return cluster
    say(
        "the service runs on the database it was started with; `runyard dev down && runyard "
        f"dev up` moves it to the dev cluster's own Postgres ({cluster.own_database.root})"
    )
    return replace(cluster, database_url=older[0])


def _start_service(
    cluster: DevCluster, table: dict[str, Started], shape: ClusterShape, say: Progress
) -> None:
    cluster = database_in_use(cluster, table, say)
    if cluster.database_url == cluster.own_database.url:
        say("making sure the dev cluster's Postgres runs and the database is migrated")
        pg_instance.ensure(cluster.own_database, table, _wait)
        cluster.table.save(table)
    else:
        say("making sure Postgres runs and the database is migrated")
        postgres.ensure_running()
        postgres.ensure_database(cluster.database_url)
    postgres.migrate(cluster.database_url, env=cluster.service_env())
    _stop_plain_http(cluster, table, say)
    _mint_tokens(cluster, shape)
    _check_replica_count(cluster, table)
    log_dir = cluster.state_dir / "log"
    for index, port in enumerate(cluster.replica_ports):
        key = cluster.replica_key(index)
        start = port_claim.claim(port, key, table, cluster.state_dir, say)
        cluster.table.save(table)  # with the listener's PID, where it adopted one
        if not start:
            continue
        url = f"https://127.0.0.1:{port}"
        say(f"starting the service on {url}")
        log_name = "service.out" if cluster.replicas == 1 else f"service-{index + 1}.out"
        table[key] = spawn(
            key,
            service_argv(),
            log_dir / log_name,
            env=cluster.service_env(port),
            user=identity.SERVICE_USER,  # never root: it acts as users through sudo only
        )
        cluster.table.save(table)
        # One at a time: the first replica's reconciler takes the leader lock.
        _wait(f"the service on port {port}", _healthy_at(url, cluster.tls.ca_cert), 60)
    if cluster.replicas > 1 and (not (p := table.get("proxy")) or not is_alive(p)):
        say(f"starting the proxy on {cluster.service_url} for ports {cluster.replica_ports}")
        table["proxy"] = spawn(
            "proxy",
            proxy_argv(cluster.service_port, cluster.replica_ports),
            log_dir / "proxy.out",
        )
        cluster.table.save(table)
    _wait("the service", _healthy_at(cluster.service_url, cluster.tls.ca_cert), 60)
    start_agents(cluster, cluster, shape.node_names, table)
    cluster.table.save(table)


def start_agents(
    service: DevCluster, on: DevCluster, nodes: list[str], table: dict[str, Started]
) -> None:
    """A health agent for each of `on`'s `nodes` not running yet, reporting to `service`'s
    service (the first cluster's): its kernel log and state in `on`'s folder, and
    `--cluster` where `on` is a further cluster (node names repeat across clusters)."""
    elsewhere = ["--cluster", on.cluster_name] if on.member != service.member else []
    for node in nodes:
        key = f"agent:{node}"
        if (p := table.get(key)) and is_alive(p):
            continue
        table[key] = spawn(
            key,
            [
                sys.executable,
                "-m",
                "worker.agent",
                "--node",
                node,
                *elsewhere,
                "--service-url",
                service.service_url,
                "--kernel-log",
                str(on.kern_log(node)),
                "--state-dir",
                str(on.state_dir / "nodes" / node),
                "--run-logs",
                str(service.state_dir / "jobs" / "**" / "*.out"),
            ],
            on.state_dir / "log" / f"agent-{node}.out",
            env={
                **service.service_env(),
                "RUNYARD_AGENT_TOKEN": on.agent_token_file(node).read_text().strip(),
            },
        )


def _mint_tokens(cluster: DevCluster, shape: ClusterShape) -> None:
    """An admin token for the person at the keyboard and one agent token per node, minted
    by the service's own bootstrap (one process for all of them: the CLI talks to the
    service over HTTP and never imports it)."""
    wanted: list[dict[str, object]] = [
        {
            "user": "admin",
            "team": "ops",
            "role": "admin",
            "out": cluster.admin_token_file,
            "unix": identity.ADMIN_UNIX_USER,  # the admin's own runs run as ops
        }
    ]
    # The two users of two teams, each linked to their Unix user (their runs run as them).
    wanted += [
        {
            "user": user.name,
            "team": user.team,
            "role": "user",
            "out": cluster.user_token_file(user.name),
            "unix": user.name,
        }
        for user in identity.DEV_USERS
        if user.name != identity.ADMIN_UNIX_USER
    ]
    mint_tokens(cluster, [*wanted, *agent_tokens(cluster, shape.node_names)])


def agent_tokens(on: DevCluster, nodes: list[str]) -> list[dict[str, object]]:
    """One agent token per node of `on`, in its folder; a further cluster's agents are
    named after their cluster too (agent-runyard-dev-b-gpu001)."""
    whose = "" if on.member == 1 else f"{on.cluster_name}-"
    return [
        {
            "user": f"agent-{whose}{node}",
            "team": "ops",
            "role": "agent",
            "node": node,
            "cluster": on.cluster_name,
            "out": on.agent_token_file(node),
        }
        for node in nodes
    ]


def mint_tokens(cluster: DevCluster, wanted: list[dict[str, object]]) -> None:
    """Mint `wanted` into `cluster`'s database with the service's own bootstrap."""
    listing = cluster.state_dir / "tokens-to-mint.json"
    listing.write_text(json.dumps(wanted, default=str))
    subprocess.run(
        [sys.executable, "-m", "service.auth.bootstrap", "--from-json", str(listing)],
        env={**os.environ, "RUNYARD_DATABASE_URL": cluster.database_url},
        cwd=REPO_ROOT,
        check=True,
        stdout=subprocess.DEVNULL,
    )


def down(cluster: DevCluster | None = None, say: Progress = print) -> list[str]:
    """Stop what `up` started, newest first, and the further clusters of `--clusters`
    before the first (their slurmctlds report to its slurmdbd). Returns the names that were
    running, a member's under its cluster's name (runyard-dev-b/slurmctld)."""
    cluster = cluster or DevCluster(default_state_dir())
    stopped = []
    for member in cluster.members_started():
        stopped += _stop_recorded(member, say, label=f"{member.cluster_name}/")
    return stopped + _stop_recorded(cluster, say)


def _stop_recorded(cluster: DevCluster, say: Progress, label: str = "") -> list[str]:
    """Stop the processes of one cluster's table, clients before servers; their names,
    each after `label`."""
    table = cluster.table.load()
    # Clients before servers: agents and the service, then the service's database, the
    # nodes, the controller, then the accounting daemon and its database, munge last.
    last = [pg_instance.PROCESS_NAME, "slurmd:", "slurmctld", "slurmdbd", "mariadb", "munged"]
    order = sorted(
        table, key=lambda n: (next((i for i, p in enumerate(last) if n.startswith(p)), -1), n)
    )
    stopped = [
        name
        for name in order
        if (pg_instance.shut_down if name == pg_instance.PROCESS_NAME else stop)(table[name])
    ]
    for name in stopped:
        say(f"stopped {label}{name}")
    cluster.table.save({})
    return [label + name for name in stopped]


def stop_control_plane(cluster: DevCluster) -> bool:
    """Stop the dev cluster's service and agents, leaving Slurm running; True if any of
    them ran (agents left running without their service are brought back with it too).

    For the test suite, which drives this Slurm cluster with a service and agents of its
    own: the idle ones here would reconcile the same cluster meanwhile (about a tenth of a
    core on a two-core machine). A dev cluster with service replicas behind a proxy is left
    as it is, since `up` with the defaults would not bring that shape back.
    """
    table = cluster.table.load()
    names = [n for n in table if n.startswith(("service", "proxy", "agent:"))]
    if any(n.startswith(("service:", "proxy")) for n in names):
        return False
    stopped = stop_together([table[name] for name in sorted(names)])
    for name in names:
        del table[name]
    cluster.table.save(table)
    for member in cluster.members_started():  # `--clusters`: its agents report here too
        member_table = member.table.load()
        agents = sorted(n for n in member_table if n.startswith("agent:"))
        stopped += stop_together([member_table.pop(name) for name in agents])
        member.table.save(member_table)
    return bool(stopped)


def status(cluster: DevCluster | None = None) -> dict[str, dict[str, object]]:
    """Each process `up` started, with whether it still runs; a further cluster's of
    `--clusters` under its cluster's name (runyard-dev-b/slurmctld)."""
    cluster = cluster or DevCluster(default_state_dir())
    labelled = [("", cluster)] + [(f"{m.cluster_name}/", m) for m in cluster.members_started()]
    return {
        label + name: {"pid": proc.pid, "running": is_alive(proc), "log": proc.log}
        for label, one in labelled
        for name, proc in one.table.load().items()
    }
