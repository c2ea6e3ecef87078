"""`runyard doctor` against the real dev cluster: healthy says so, and each broken part
(slurmctld stopped, an agent stopped, a read-only checkpoint folder) is named.

The doctor runs as the real CLI in a process of its own, against a service and agents of
this module's own (a database of its own, heartbeat limits long enough that stopping an
agent never makes that service drain a node in the shared Slurm)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from client.devcluster import cluster, pg_instance, postgres
from client.devcluster.cluster import DevCluster
from client.devcluster.identity import SERVICE_USER
from client.devcluster.processes import Started, stop
from tests.conftest import ADMIN_UNIX_USER, REPO_ROOT, TEST_DATABASE, mint_token, wait_for
from tests.integration.conftest import Agents, ServiceProcess, free_port, service_state_dir

pytestmark = pytest.mark.integration
RUNYARD = Path(sys.executable).parent / "runyard"  # the installed CLI, as a site runs it


class Site:
    def __init__(
        self, service: ServiceProcess, agents: Agents, dev: DevCluster, root: Path, db: str
    ):
        self.service, self.agents, self.dev, self.database_url = service, agents, dev, db
        self.checkpoints = root / "checkpoints"
        self.checkpoints.mkdir(exist_ok=True)  # the state folder's shared root (issue 28)

    def doctor(self, *args: str) -> tuple[int, dict[str, Any]]:
        env = {
            **os.environ,
            "RUNYARD_URL": self.service.url,
            "RUNYARD_TOKEN": self.service.admin_token,
            "RUNYARD_DATABASE_URL": self.database_url,
            "SLURM_CONF": str(self.dev.slurm_conf),
            "RUNYARD_CHECKPOINT_ROOT": str(self.checkpoints),
        }
        out = subprocess.run(
            # The service's own settings file, as a site's unit loads it (the secrets
            # check reads its owner and mode); the environment above overrides it.
            [
                str(RUNYARD),
                "doctor",
                "--json",
                "--settings",
                str(self.service.settings_file),
                *args,
            ],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO_ROOT,
            timeout=120,
        )
        return out.returncode, json.loads(out.stdout)


def by_name(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {f"{c['area']} {c['name']}": c for c in report["checks"]}


@pytest.fixture(scope="module")
def site(slurm_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Site]:
    root = service_state_dir("doctor")
    # A database as a site keeps it (and as the dev cluster does): a server of its own that
    # asks every local user for a password (client/devcluster/pg_instance.py), which the
    # doctor's "local users refused" check wants; the machine's own Postgres trusts all.
    database = pg_instance.Instance(
        root=root / "postgres",
        port=free_port(),
        owner=SERVICE_USER,
        database="runyard",
        role=SERVICE_USER,
        log=root / "log" / "postgres.out",
    )
    table: dict[str, Started] = {}
    pg_instance.ensure(database, table, wait_for)
    postgres.migrate(database.url)
    token = mint_token(
        database.url,
        root / "admin.token",
        user="admin",
        team="ops",
        role="admin",
        unix=ADMIN_UNIX_USER,
    )
    port = free_port()
    env = {
        **os.environ,
        "RUNYARD_DATABASE_URL": database.url,
        "RUNYARD_PORT": str(port),
        "RUNYARD_STATE_DIR": str(root),
        "RUNYARD_SLURM_CONF": str(slurm_cluster.slurm_conf),
        "SLURM_CONF": str(slurm_cluster.slurm_conf),
        "RUNYARD_RUN_RECONCILER": "true",
        "RUNYARD_ACCELERATOR": "cpu",
        "RUNYARD_RECONCILE_INTERVAL_S": "0.5",
        "RUNYARD_HEARTBEAT_SUSPECT_S": "600",
        "RUNYARD_HEARTBEAT_DEAD_S": "1200",
    }
    service = ServiceProcess(env, root, token, port=port)
    service.start()
    client = service.client()
    wait_for("the nodes read from Slurm", lambda: len(client.list_nodes()) >= 8)
    nodes = [n["name"] for n in client.list_nodes()]
    agents = Agents(root / "agents", service, nodes)
    for node in nodes:
        agents.start(node)
    wait_for(
        "every agent's first heartbeat",
        lambda: all(n["last_heartbeat_at"] for n in client.list_nodes()),
    )
    yield Site(service, agents, slurm_cluster, root, database.url)
    for node in list(agents.procs):
        agents.stop(node)
    service.stop()
    pg_instance.shut_down(table[pg_instance.PROCESS_NAME])


def test_doctor_says_a_healthy_dev_cluster_is_healthy(site: Site) -> None:
    rc, report = site.doctor("--min-free-gb", "1")
    checks = by_name(report)
    assert rc == 0 and report["healthy"], checks
    assert {c["status"] for c in checks.values()} <= {"ok", "warn"}
    for name in ("slurm controller", "slurm topology", "slurm gres", "slurm reservations"):
        assert checks[name]["status"] == "ok", checks[name]
    assert checks["postgres migrated"]["status"] == "ok"
    assert checks["agents heartbeats"]["detail"].startswith("all 8 nodes")


def test_doctor_names_a_node_whose_agent_stopped(site: Site) -> None:
    site.agents.stop("gpu003")
    try:

        def named() -> dict[str, Any] | None:
            rc, report = site.doctor("--only", "agents", "--heartbeat-max-age-s", "3")
            return report if rc == 1 else None

        report = wait_for("the doctor to notice gpu003's agent", named, timeout_s=30)
        beats = by_name(report)["agents heartbeats"]
        assert beats["status"] == "FAIL"
        assert "gpu003" in beats["detail"] and "gpu004" not in beats["detail"]
        assert "runyard-agent" in beats["fix"]
    finally:
        site.agents.start("gpu003")
    wait_for("gpu003 healthy again", lambda: site.doctor("--only", "agents")[0] == 0, timeout_s=30)


def test_doctor_names_a_read_only_checkpoint_folder(site: Site) -> None:
    # A read-only bind mount: as root, permission bits would not stop the write.
    subprocess.run(
        ["mount", "--bind", "-o", "ro", str(site.checkpoints), str(site.checkpoints)], check=True
    )
    try:
        rc, report = site.doctor("--only", "filesystem", "--min-free-gb", "1")
    finally:
        subprocess.run(["umount", str(site.checkpoints)], check=True)
    checks = by_name(report)
    assert rc == 1
    assert checks["filesystem checkpoints"]["status"] == "FAIL"
    assert "Read-only file system" in checks["filesystem checkpoints"]["detail"]
    assert str(site.checkpoints) in checks["filesystem checkpoints"]["detail"]
    assert site.doctor("--only", "filesystem", "--min-free-gb", "1")[0] == 0


def test_doctor_names_a_stopped_slurmctld(site: Site) -> None:
    """Stops the shared dev cluster's slurmctld: the tests hold the integration lock, and
    `dev up`'s own start brings it back before the test ends."""
    table = site.dev.table.load()
    stop(table["slurmctld"])
    try:
        rc, report = site.doctor("--only", "slurm", "--only", "filesystem", "--min-free-gb", "1")
    finally:
        cluster.up(cluster=site.dev, with_service=False, say=lambda _: None)
    checks = by_name(report)
    assert rc == 1
    assert checks["slurm controller"]["status"] == "FAIL"
    assert "slurmctld" in checks["slurm controller"]["fix"]
    assert checks["slurm gres"]["status"] == "skip"
    assert checks["filesystem written from nodes"]["status"] == "skip"
    assert site.doctor("--only", "slurm")[0] == 0


def hook_env(site: Site, tmp_path: Path, node: str, **extra: str) -> dict[str, str]:
    """What deploy/'s scripts see on a node: /etc/runyard/agent.env's settings (a file of the
    test's own, root's, as the hooks require) and runyard installed at RUNYARD_HOME (this
    checkout's virtualenv); the health check's own folder in the test's."""
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    if not (home / "venv").exists():
        (home / "venv").symlink_to(Path(sys.executable).parent.parent)
    env_file = tmp_path / "agent.env"
    env_file.write_text(
        f"RUNYARD_NODE={node}\nRUNYARD_HOME={home}\nRUNYARD_KERNEL_LOG={tmp_path / 'kern.log'}\n"
        f"RUNYARD_AGENT_STATE_ROOT={site.agents.root}\n"
        f"RUNYARD_HEALTHCHECK_STATE_ROOT={tmp_path / 'healthcheck'}\n"
    )
    return {
        **os.environ,
        "RUNYARD_AGENT_ENV": str(env_file),
        "SLURM_CONF": str(site.dev.slurm_conf),
        **extra,
    }


def test_health_check_program_drains_a_node_with_runyards_reason(
    site: Site, tmp_path: Path
) -> None:
    node = "gpu008"
    env = hook_env(site, tmp_path, node)
    script = REPO_ROOT / "deploy" / "runyard-healthcheck.sh"
    (tmp_path / "kern.log").write_text("an ordinary line\n")
    assert subprocess.run([str(script)], env=env, timeout=60).returncode == 0
    (tmp_path / "kern.log").write_text(
        "an ordinary line\nNVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, "
        "GPU has fallen off the bus.\n"
    )
    try:
        assert subprocess.run([str(script)], env=env, timeout=60).returncode == 1
        reason = subprocess.run(
            ["sinfo", "-h", "-R", "-n", node, "-o", "%E"], env=env, capture_output=True, text=True
        ).stdout.strip()
        assert reason == "runyard: healthcheck: xid 79 on PCI:0000:3b:00"
    finally:
        subprocess.run(["scontrol", "update", f"nodename={node}", "state=resume"], env=env)
    # The next check reads only new lines: the repaired node stays in service.
    assert subprocess.run([str(script)], env=env, timeout=60).returncode == 0


def test_prolog_and_epilog_reach_the_service_through_the_agent(site: Site, tmp_path: Path) -> None:
    node = "gpu002"
    slurm_vars = {"SLURMD_NODENAME": node, "SLURM_JOB_ID": "987654", "SLURM_JOB_NAME": "hooked"}
    env = hook_env(site, tmp_path, node, **slurm_vars)
    for phase in ("prolog", "epilog"):
        done = subprocess.run([str(REPO_ROOT / "deploy" / f"slurm-{phase}.sh")], env=env)
        assert done.returncode == 0
    client = site.service.client()

    def job_events() -> list[dict[str, Any]]:
        events = client.get_node(node)["events"]
        return [e for e in events if e["kind"].startswith("slurm:job_")]

    def both_phases() -> list[dict[str, Any]] | None:
        events = job_events()
        return events if len(events) == 2 else None

    delivered = wait_for("the agent to deliver both hook events", both_phases)
    # Each phase as itself: the prolog's start, the epilog's end, of this job on this node.
    assert {e["kind"]: e["message"] for e in delivered} == {
        "slurm:job_start": f"job 987654 (hooked) started on {node}",
        "slurm:job_end": f"job 987654 (hooked) ended on {node}",
    }


def accounting_on(conf: str) -> bool:
    out = subprocess.run(
        ["scontrol", "show", "config"],
        capture_output=True,
        text=True,
        env={**os.environ, "SLURM_CONF": conf},
    )
    return "accounting_storage/slurmdbd" in out.stdout


def test_sacct_knows_how_a_job_ended_and_the_service_reads_it(
    site: Site, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = str(site.dev.slurm_conf)
    if not accounting_on(conf):
        pytest.skip("the dev cluster has no accounting (slurmdbd not installed)")
    monkeypatch.setenv("SLURM_CONF", conf)
    from service.slurm.accounting import ended_jobs
    from service.slurm.target import SlurmTarget

    name = f"{TEST_DATABASE}-sacct"
    # Output to /dev/null: a batch job writes slurm-<id>.out into the submitter's folder.
    submit = ["sbatch", "--parsable", "-J", name, "-p", "train", "-N1", "-o", "/dev/null"]
    job = subprocess.run(
        [*submit, "--wrap", "exit 3"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    ended = wait_for(
        f"sacct to record job {job}'s end", lambda: ended_jobs(SlurmTarget(""), [job]).get(job)
    )
    assert (ended.state, ended.exit_code) == ("FAILED", 3)

    # By name: a dev cluster rebuilt from scratch starts its job ids again, and sacct -j
    # then shows the newest record of an id, which may be an older cluster's job.
    def listed() -> list[str]:
        return subprocess.run(
            ["sacct", "-n", "-X", "-P", "--name", name, "-o", "JobID,JobName,State,ExitCode"],
            capture_output=True,
            text=True,
        ).stdout.split()

    wait_for(f"sacct to list job {job} by its name", lambda: f"{job}|{name}|FAILED|3:0" in listed())
