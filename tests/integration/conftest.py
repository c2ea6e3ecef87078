"""The local Slurm cluster and a service process of the tests' own."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import pytest
from runyard_client.tls import client_context

from client.api import RunyardClient
from client.devcluster import accounting, cluster, multicluster
from client.devcluster.cluster import DevCluster
from client.devcluster.identity import SERVICE_USER, prepare_state_dir
from client.devcluster.processes import is_alive
from planner.presets import MODEL_PRESETS
from tests.conftest import ENVIRONMENT_AT_START, REPO_ROOT, TEST_DATABASE, free_port, wait_for

SERVICE_PORT = free_port()
# Every step of the tests' runs takes at least this long (worker/faults.py, pace_step). The
# tests inject a fault once a run trains and then wait for its detection, so a run must not
# be done first; its step counts were sized at 60-80 ms a step, and on a day the same
# machine computed a step in 35 ms three runs finished too early.
STEP_PACE_S = 0.06


def paced_faults() -> str:
    """RUNYARD_FAULT for the tests' services: the faults the test modules injected, and the
    pace for every run (a fault's own duration wins where it sleeps longer)."""
    return ",".join(filter(None, (os.environ.get("RUNYARD_FAULT"), f"pace_step:1:*={STEP_PACE_S}")))


def slurm(*args: str, conf: str) -> str:
    """Run a Slurm client command against the dev cluster; its stdout."""
    env = {**os.environ, "SLURM_CONF": conf}
    return subprocess.run(list(args), capture_output=True, text=True, env=env).stdout


@contextmanager
def other_work(conf: str, leave_idle: int) -> Iterator[str]:
    """A job outside runyard holding every idle node but `leave_idle`, running once this
    yields its id (what the runs placed next must live beside); scancelled after."""
    idle = len(slurm("sinfo", "-h", "-N", "-t", "idle", "-o", "%N", conf=conf).split())
    job = slurm(
        "sbatch", "--parsable", "--exclusive", f"-N{idle - leave_idle}",
        f"--job-name=runyard-{TEST_DATABASE}-blocker", "--output=/dev/null",
        "--wrap", "sleep 900", conf=conf,
    ).strip()  # fmt: skip
    try:
        wait_for(
            "the other work to start",
            lambda: slurm("squeue", "-h", "-j", job, "-o", "%T", conf=conf).strip() == "RUNNING",
        )
        yield job
    finally:
        slurm("scancel", job, conf=conf)


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[DevCluster]:
    """The dev cluster's Slurm part (started if it is not up; left running afterwards).

    Its own service and agents, if `dev up` started them, are stopped for the session and
    started again after it, with the environment the session started with: the tests bring
    their own, and their settings (the reconciler off, injected faults) must not follow."""
    dev = DevCluster(cluster.default_state_dir())
    cluster.up(cluster=dev, with_service=False, say=lambda _: None)
    clean_up_test_leftovers(dev)
    paused = cluster.stop_control_plane(dev)
    # Every client of the tests' services (the CLI in-process and as a child, agents,
    # workers) verifies their HTTPS with the dev cluster's CA, as a site's verify its own.
    os.environ["RUNYARD_CA"] = str(dev.tls.ca_cert)
    yield dev
    if paused:
        with mock.patch.dict(os.environ, ENVIRONMENT_AT_START, clear=True):
            cluster.up(cluster=dev, say=lambda _: None)


@pytest.fixture(scope="session")
def second_cluster(slurm_cluster: DevCluster) -> Iterator[DevCluster]:
    """runyard-dev-b, a second real Slurm cluster beside the dev cluster (its own slurmctld
    and slurmds, the first's slurmdbd; client/devcluster/multicluster.py): `dev up
    --clusters 2`'s own where that runs (left running), else one of this session's, in a
    folder of its own, stopped and removed after. Skipped without Slurm accounting, where
    the clusters meet."""
    if not accounting.available() or not accounting.listening(slurm_cluster.dbd_port):
        pytest.skip(
            "no Slurm accounting here (slurmdbd, mariadb-server; scripts/bootstrap.sh "
            "installs them): the clusters meet in one slurmdbd"
        )
    running = slurm_cluster.member_cluster(2)
    slurmctld = running.table.load().get("slurmctld")
    if slurmctld is not None and is_alive(slurmctld):
        yield running
        return
    # Under /tmp/runyard-tests (0755), as the tests' services' folders: slurmd writes the
    # dev users' job files from there.
    own = replace(running, state_dir=Path(f"/tmp/runyard-tests/{TEST_DATABASE}-cluster-b"))
    own.state_dir.parent.mkdir(parents=True, exist_ok=True)
    own.state_dir.parent.chmod(0o755)
    shape = cluster.saved_shape(slurm_cluster)
    assert shape is not None
    try:
        multicluster.up_member(own, shape, say=lambda _: None)
        yield own
    finally:
        cluster.down(own, say=lambda _: None)
        shutil.rmtree(own.state_dir, ignore_errors=True)


def clean_up_test_leftovers(dev: DevCluster, prefix: str = "runyard-runyard_test") -> None:
    """Cancel test jobs, delete test reservations and resume runyard's drains.

    Run before a session (an earlier one may have died) and after it: the test suite owns the
    dev cluster's state while it runs.
    """
    env = dev.slurm_env()

    def slurm(*args: str) -> str:
        return subprocess.run(list(args), capture_output=True, text=True, env=env).stdout

    def belongs_to_a_live_session(name: str) -> bool:
        """runyard-runyard_test_<pid>-...: that pytest process may still be running."""
        pid = name.removeprefix("runyard-runyard_test_").split("-")[0]
        if not pid.isdigit() or name.startswith(f"runyard-{TEST_DATABASE}"):
            return False
        return Path(f"/proc/{pid}").exists()

    for line in slurm("squeue", "-h", "-o", "%i %j").splitlines():
        job_id, _, name = line.strip().partition(" ")
        if name.startswith(prefix) and not belongs_to_a_live_session(name):
            slurm("scancel", job_id)
    for line in slurm("scontrol", "show", "reservation", "-o").splitlines():
        name = line.split()[0].partition("=")[2] if line.startswith("ReservationName=") else ""
        if name.startswith(prefix) and not belongs_to_a_live_session(name):
            slurm("scontrol", "delete", f"reservation={name}")
    for line in slurm("scontrol", "show", "node", "-o").splitlines():
        fields = dict(t.partition("=")[::2] for t in line.split() if "=" in t)
        if "DRAIN" in fields.get("State", "") and "Reason=runyard:" in line:
            slurm("scontrol", "update", f"nodename={fields['NodeName']}", "state=resume")


def tls_settings() -> dict[str, str]:
    """A service's HTTPS on the dev cluster's certificate (client/devcluster/tls.py), and
    the CA it hands its jobs."""
    return DevCluster(cluster.default_state_dir()).tls.service_settings()


class ServiceProcess:
    """The real service (uvicorn + reconciler) as a child process that tests can restart,
    started as a site starts it: deploy/runyard-service.sh with its settings file, as the
    service's own user. The file (mode 0600, the service's) holds the settings; the process
    environment adds only what the machine needs (PATH, the Python to use)."""

    def __init__(
        self,
        settings: dict[str, str],
        state_dir: Path,
        admin_token: str,
        port: int = SERVICE_PORT,
        name: str = "runyard",
        tls: bool = True,
    ) -> None:
        prepare_state_dir(state_dir)
        self.settings_file = state_dir / "service" / f"{name}.env"
        self.log = state_dir / f"{name}.log"
        self.admin_token, self.port = admin_token, port
        self.url = f"{'https' if tls else 'http'}://127.0.0.1:{port}"
        self.proc: subprocess.Popen[bytes] | None = None
        # The service's settings only: what a site writes into its runyard.env. Dev mode:
        # the tests' fault hooks (inject_faults, paced_faults) reach the jobs only so.
        # HTTPS with the dev cluster's certificate (`tls`), as a site serves it.
        given = {
            k: v
            for k, v in settings.items()
            if (k.startswith("RUNYARD_") or k == "SLURM_CONF") and not k.startswith("RUNYARD_TLS")
        }
        self.settings = {"RUNYARD_ENVIRONMENT": "dev", **(tls_settings() if tls else {})} | given

    def write_settings(self) -> None:
        """The settings file, readable by the service's user alone (docs/install.md)."""
        text = "".join(f"{key}={value}\n" for key, value in self.settings.items())
        fd = os.open(self.settings_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
        shutil.chown(self.settings_file, SERVICE_USER, SERVICE_USER)

    @property
    def env(self) -> dict[str, str]:
        """The settings as the service sees them (what tests hand to other processes)."""
        return {**os.environ, **self.settings}

    def start(self) -> None:
        self.write_settings()  # as tests changed them since the last start
        machine = {k: v for k, v in os.environ.items() if not k.startswith("RUNYARD_")}
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen(
                ["sh", str(REPO_ROOT / "deploy" / "runyard-service.sh"), str(self.settings_file)],
                env={**machine, "RUNYARD_SERVICE_PYTHON": sys.executable},
                cwd=REPO_ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                # As on the dev cluster and at a site: the service's own unprivileged user,
                # acting as each run's owner through the one sudoers rule only.
                user=SERVICE_USER,
                group=SERVICE_USER,
                extra_groups=[],
            )
        wait_for("the service to answer /healthz", self.healthy, timeout_s=60)

    def healthy(self) -> bool:
        try:
            verify = client_context()  # RUNYARD_CA: the dev cluster's (slurm_cluster)
            return httpx.get(f"{self.url}/healthz", timeout=1, verify=verify).status_code == 200
        except httpx.HTTPError:
            return False

    def kill(self) -> None:
        """SIGKILL: no lifespan shutdown, no rollback; as when the host dies."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def client(self, token: str | None = None) -> RunyardClient:
        """An API client, as the admin unless another token is given."""
        return RunyardClient(self.url, token=token or self.admin_token)


def service_state_dir(name: str) -> Path:
    """A service's state folder outside pytest's own temporary root (mode 0700, root's):
    the service's user and the runs' owners must reach it, as they reach a site's shared
    filesystem. Made fresh; removed by the caller."""
    state_dir = Path(f"/tmp/runyard-tests/{TEST_DATABASE}-{name}")
    shutil.rmtree(state_dir, ignore_errors=True)
    state_dir.mkdir(parents=True)
    state_dir.parent.chmod(0o755)
    prepare_state_dir(state_dir)
    return state_dir


@pytest.fixture(scope="session")
def service(
    database_url: str,
    slurm_cluster: DevCluster,
    tmp_path_factory: pytest.TempPathFactory,
    admin_token: str,
) -> Iterator[ServiceProcess]:
    state_dir = service_state_dir("service")
    settings = {
        "RUNYARD_DATABASE_URL": database_url,
        "RUNYARD_PORT": str(SERVICE_PORT),
        "RUNYARD_STATE_DIR": str(state_dir),
        "RUNYARD_SLURM_CONF": str(slurm_cluster.slurm_conf),
        "RUNYARD_RUN_RECONCILER": "true",
        "RUNYARD_ACCELERATOR": "cpu",
        "RUNYARD_RECONCILE_INTERVAL_S": "0.5",
        # Fast failure detection, so the recovery tests finish in seconds.
        "RUNYARD_HEARTBEAT_SUSPECT_S": "4",
        "RUNYARD_HEARTBEAT_DEAD_S": "8",
        # A node drained for lost heartbeats alone returns after this long of them again.
        "RUNYARD_HEARTBEAT_RETURN_S": "6",
        # The tests' webhook receivers listen on this machine's loopback, which a site's
        # service refuses by default (service/notifications/egress.py).
        "RUNYARD_WEBHOOK_ALLOWED_NETWORKS": "127.0.0.0/8",
        "RUNYARD_HANG_MIN_S": "15",
        # Runs with a 1-minute time limit are stopped 45 s before it: 15 s segments.
        "RUNYARD_SEGMENT_STOP_MARGIN_S": "45",
        "SLURM_CONF": str(slurm_cluster.slurm_conf),
        "RUNYARD_FAULT": paced_faults(),
    }
    empty_service_tables(database_url)
    svc = ServiceProcess(settings, state_dir, admin_token)
    svc.start()
    yield svc
    svc.stop()
    clean_up_test_leftovers(slurm_cluster, prefix=f"runyard-{TEST_DATABASE}")
    shutil.rmtree(state_dir, ignore_errors=True)


# What a service makes as it runs. The unit tier, run first when one `pytest` runs both,
# commits such rows to the same database through the reconciler's own transactions (nodes
# and runs of its fake cluster `default`): the integration tests' service must start as on
# a new site, its node list the dev cluster's nodes alone. The tokens, teams and user links
# the session minted stay.
# Deleted, not truncated, in this order: a run's worker tokens go with it (ON DELETE
# CASCADE), where TRUNCATE ... CASCADE would empty the whole token table.
SERVICE_MADE_TABLES = (
    "notification_deliveries",
    "notification_subscriptions",
    "tracker_exports",
    "plan_outcomes",
    "incidents",
    "runs",
    "sweeps",
    "node_events",
    "nodes",
    "cluster_settings",
    "audit_log",
)


def empty_service_tables(database_url: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(database_url)
    try:
        with engine.begin() as conn:
            for table in SERVICE_MADE_TABLES:
                conn.execute(text(f"DELETE FROM {table}"))
    finally:
        engine.dispose()


@pytest.fixture(autouse=True)
def site_cluster_name(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The unit tier names its one cluster `default` in the environment (tests/unit/
    conftest.py); in one `pytest` with it, that name would follow into these tests' own
    in-process settings (and what they hand to CLIs and workers), where the dev cluster is
    named by its slurm.conf, as at a site."""
    from service.config import get_settings

    if "RUNYARD_CLUSTER_NAME" not in ENVIRONMENT_AT_START:
        monkeypatch.delenv("RUNYARD_CLUSTER_NAME", raising=False)
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def inject_faults(*faults: str) -> None:
    """Add worker fault hooks (worker/faults.py; name each's run) for the session's service.

    Call at a test module's import: the service's Slurm jobs inherit its environment, and
    the session's service starts after collection, so the hooks reach the workers whichever
    test starts it."""
    current = os.environ.get("RUNYARD_FAULT")
    os.environ["RUNYARD_FAULT"] = ",".join(f for f in (current, *faults) if f)


def ended(client: RunyardClient, run_id: int) -> dict[str, Any] | None:
    """The run, once it has ended (SUCCEEDED, FAILED or CANCELLED); None before."""
    run = client.get_run(run_id)
    return run if run["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") else None


def losses(client: RunyardClient, run_id: int, attempt_id: int | None = None) -> dict[int, float]:
    """Step -> reported loss of the run (of one of its attempts, if given)."""
    return {
        m["step"]: m["loss"]
        for m in client.run_metrics(run_id, limit=10_000)  # the API's largest page
        if attempt_id is None or m["attempt_id"] == attempt_id
    }


# The tests' runs train the "tiny" preset's shape with one block instead of two: a step
# costs 30% less CPU (22 against 32 ms, 300-step runs on the dev cluster), and the ranks
# share two cores with the service, the agents and Slurm. Layouts that split the blocks
# (pipeline stages) ask for the preset itself.
ONE_BLOCK_MODEL = MODEL_PRESETS["tiny"].model_dump() | {"layers": 1}


def tiny_spec(name: str, **overrides: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "name": name,
        "model": ONE_BLOCK_MODEL,
        "nodes": 2,
        "gpus_per_node": 1,
        "seq_len": 64,
        "global_batch": 8,
        "steps": 300,
        "lr": 3e-3,
        "checkpoint_every": 20,
        "max_restarts": 2,
    }
    return {**spec, **overrides}


class Agents:
    """One real health agent per node, reporting to the tests' service. Their kernel logs
    are files of the tests' own, so the dev cluster's agents never see the injected lines."""

    def __init__(
        self, root: Path, service: ServiceProcess, nodes: list[str], cluster: str | None = None
    ) -> None:
        self.root, self.service, self.nodes = root, service, nodes
        self.cluster = cluster  # their nodes' cluster (None: the service's default one)
        self.procs: dict[str, subprocess.Popen[bytes]] = {}

    def kern_log(self, node: str) -> Path:
        return self.root / node / "kern.log"

    def start(self, node: str) -> None:
        (self.root / node).mkdir(parents=True, exist_ok=True)
        self.kern_log(node).touch()
        token_file = self.root / node / "agent.token"
        if not token_file.exists():
            created = self.service.client().create_token(
                user=f"agent-{node}", team="ops", role="agent", node_name=node, cluster=self.cluster
            )
            token_file.write_text(created["token"])
        env = {**os.environ, "RUNYARD_AGENT_TOKEN": token_file.read_text().strip()}
        with open(self.root / node / "agent.log", "ab") as out:
            self.procs[node] = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "worker.agent",
                    "--node",
                    node,
                    "--service-url",
                    self.service.url,
                    "--kernel-log",
                    str(self.kern_log(node)),
                    "--state-dir",
                    str(self.root / node),
                    "--interval-s",
                    "1",
                    *(["--cluster", self.cluster] if self.cluster else []),
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
                env=env,
            )

    def stop(self, node: str, *, kill: bool = False) -> None:
        """Stop the node's agent: SIGTERM, or SIGKILL (`kill`: no goodbye, as a crash)."""
        proc = self.procs.pop(node, None)
        if proc is not None:
            proc.kill() if kill else proc.terminate()
            proc.wait(timeout=10)

    def stop_all(self) -> None:
        """SIGTERM to every agent at once, then wait for each: one at a time, each agent's
        goodbye to the service added up to seconds of the session's end."""
        procs, self.procs = list(self.procs.values()), {}
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(timeout=10)

    def append(self, node: str, line: str) -> None:
        with self.kern_log(node).open("a") as f:
            f.write(line.rstrip("\n") + "\n")


@pytest.fixture(scope="session")
def agents(service: ServiceProcess, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Agents]:
    nodes = [f"gpu{i:03d}" for i in range(1, 9)]
    fleet = Agents(tmp_path_factory.mktemp("agents"), service, nodes)
    for node in nodes:
        fleet.start(node)
    client = service.client()
    wait_for(
        "every agent's first heartbeat",
        lambda: (
            all(n["last_heartbeat_at"] for n in client.list_nodes() if n["name"] in nodes)
            and len(client.list_nodes()) >= len(nodes)
        ),
    )
    yield fleet
    fleet.stop_all()


def drain_reason(node: str, conf: str) -> str:
    return slurm("sinfo", "-h", "-R", "-n", node, "-o", "%E", conf=conf).strip()


def committed(client: RunyardClient, run_id: int) -> list[int]:
    return [c["step"] for c in client.run_checkpoints(run_id) if c["state"] != "WRITING"]


@pytest.fixture
def spare_pool(service: ServiceProcess, agents: Agents) -> Iterator[RunyardClient]:
    """One spare reserved for the test; drained nodes resumed and the pool emptied after."""
    client = service.client()
    client.set_spares(1)
    wait_for("a spare in the pool", lambda: client.get_spares()["members"])
    yield client
    client.set_spares(0)
    for node in client.list_nodes():
        if node["state"] in ("DRAINED", "DRAINING"):
            client.resume_node(node["name"])
    wait_for("the spare pool to empty", lambda: not client.get_spares()["members"])


def owners_python(user: str, root: Path) -> Path:
    """The interpreter of a Python environment of `user`'s own, as a team keeps one on the
    shared filesystem: a virtualenv `user` made and owns, outside runyard's, with
    runyard-client installed into it from a wheel of this repository (no package index),
    and the heavy packages (torch, transformers, accelerate, lightning) read from runyard's
    environment's site-packages through one path line, as a site that names an existing
    environment does (docs/install.md, RUNYARD_SITE_PACKAGES): installing torch again would
    take minutes. runyard itself stays out of it: its packages are installed editable,
    through .pth files of runyard's environment, which a path line does not process."""
    home, wheels = root / user, root / "wheels"  # the user's folder: theirs, as on a site
    env = home / "python"
    shutil.rmtree(home, ignore_errors=True)
    shutil.rmtree(wheels, ignore_errors=True)
    home.mkdir(parents=True)
    root.chmod(0o755)
    shutil.chown(home, user=user)
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
         "-w", str(wheels), str(REPO_ROOT / "runyard-client")],
        check=True, capture_output=True,
    )  # fmt: skip
    wheels.chmod(0o755)
    [wheel] = wheels.glob("runyard_client-*.whl")
    wheel.chmod(0o644)
    as_user = ["runuser", "-u", user, "--"]
    base = getattr(sys, "_base_executable", sys.executable)  # the interpreter runyard's venv is of
    # Without pip of its own (ensurepip: 5 s of the fixture's 12): runyard's pip installs
    # into it, as `pip --python` does for anyone.
    subprocess.run(
        [*as_user, base, "-m", "venv", "--without-pip", str(env)], check=True, capture_output=True
    )
    heavy = sysconfig_purelib(sys.executable)
    own = sysconfig_purelib(str(env / "bin" / "python"))
    subprocess.run(
        [*as_user, "sh", "-c", 'printf "%s\\n" "$1" > "$2"', "-", heavy,
         f"{own}/runyard-heavy-packages.pth"],
        check=True, capture_output=True,
    )  # fmt: skip
    subprocess.run(
        [*as_user, sys.executable, "-m", "pip", "--python", str(env / "bin" / "python"),
         "install", "-q", "--no-index", "--no-deps", str(wheel)],
        check=True, capture_output=True, cwd="/",
    )  # fmt: skip
    return env / "bin" / "python"


def sysconfig_purelib(python: str) -> str:
    """`python`'s own site-packages folder."""
    out = subprocess.run(
        [python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
        check=True, capture_output=True, text=True, cwd="/",
    )  # fmt: skip
    return out.stdout.strip()


@pytest.fixture(scope="session")
def owner_python() -> Path:
    """The admin's runs' owner's own Python environment (owners_python)."""
    return owners_python("ops", Path(f"/tmp/runyard-tests/{TEST_DATABASE}-envs"))


XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, name=python, GPU has fallen off the bus."


@dataclass(frozen=True)
class MovedToSpare:
    """What lose_a_node_and_resume saw: the first commit, the lost node, and where the
    second attempt resumed from."""

    first_commit: int
    bad: str
    spare: str
    resume_step: int


def lose_a_node_and_resume(
    client: RunyardClient,
    run_id: int,
    agents: Agents,
    conf: str,
    commit_timeout_s: float = 120,
    cluster: str | None = None,
) -> MovedToSpare:
    """The whole path of a lost node for a 2-node run with one spare: once it trained past
    its first commit, its second node's kernel log gets an Xid 79; that node is drained,
    and attempt 2 runs on the healthy node and the spare, resuming from the newest commit
    at or below its resume step. `agents` and `conf` (a slurm.conf) are the run's
    `cluster`'s (None: the service's default one)."""
    first_commit = wait_for(
        "a committed checkpoint", lambda: committed(client, run_id), timeout_s=commit_timeout_s
    )[0]
    wait_for(
        "steps past it", lambda: (client.get_run(run_id)["last_step"] or 0) >= first_commit + 3
    )
    placed = client.get_run(run_id)["nodes"]
    # The pool is read once the run is placed: the service may have moved its one spare
    # to another idle node meanwhile (seen once in make test: the run got the old one).
    (spare,) = client.get_spares(cluster)["members"]
    assert len(placed) == 2 and spare not in placed
    bad, healthy = placed[1], placed[0]

    before = len(client.get_run(run_id)["attempts"])
    agents.append(bad, XID_79.format(pid=os.getpid()))

    wait_for(f"{bad} drained", lambda: "xid:79" in drain_reason(bad, conf), timeout_s=30)
    second = wait_for(
        f"attempt {before + 1} running",
        lambda: next(
            (a for a in client.get_run(run_id)["attempts"][before:] if a["state"] == "RUNNING"),
            None,
        ),
        timeout_s=60,
    )
    assert sorted(second["nodes"]) == sorted([healthy, spare])
    resume_step = second["resume_step"]
    assert resume_step == max(s for s in committed(client, run_id) if s <= resume_step)
    assert resume_step >= first_commit
    return MovedToSpare(first_commit, bad, spare, resume_step)
