"""Two service replicas on one Postgres behind one address: kill the leading replica in the
middle of a recovery and the other finishes it, with no duplicate attempt, no lost agent
event and no run stuck. The takeover time is printed.

The replicas, the proxy and the agents are this module's own (a database of its own), the
same way `runyard dev up --replicas 2` starts them (client/devcluster/cluster.py)."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator

import httpx
import pytest
from runyard_client.tls import client_context

from client.api import RunyardClient
from client.devcluster import postgres
from client.devcluster.cluster import DevCluster, proxy_argv
from tests.conftest import ADMIN_UNIX_USER, REPO_ROOT, TEST_DATABASE, mint_token, wait_for
from tests.integration.conftest import (
    Agents,
    ServiceProcess,
    committed,
    drain_reason,
    free_port,
    paced_faults,
    service_state_dir,
    slurm,
    tiny_spec,
)

pytestmark = pytest.mark.integration
DATABASE_URL = f"postgresql+psycopg://postgres@127.0.0.1:5432/{TEST_DATABASE}_replicas"
JOB_PREFIX = f"runyard-{TEST_DATABASE}_replicas"
RECONCILE_INTERVAL_S = 0.5
# The survivor asks for the leader lock every reconcile interval and Postgres releases a
# dead session's lock when its connection closes: a few intervals plus the first tick.
TAKEOVER_BOUND_S = 5.0
XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."
XID_92 = "NVRM: Xid (PCI:0000:3b:00): 92, pid=1, name=python, High single-bit ECC error rate"


def leads(replica: ServiceProcess) -> bool:
    """Whether this replica's reconciler has ticked (only the lock holder's does)."""
    try:
        text = httpx.get(f"{replica.url}/metrics", timeout=2, verify=client_context()).text
    except httpx.HTTPError:
        return False
    for line in text.splitlines():
        if line.startswith("runyard_reconcile_last_tick_timestamp_seconds "):
            return float(line.split()[1]) > 0
    return False


class Replicas:
    def __init__(self, a: ServiceProcess, b: ServiceProcess, front: ServiceProcess, agents: Agents):
        self.a, self.b, self.front, self.agents = a, b, front, agents

    def client(self) -> RunyardClient:
        return self.front.client()


@pytest.fixture(scope="module")
def replicas(
    slurm_cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replicas]:
    root = tmp_path_factory.mktemp("replicas")
    postgres.fresh_database(DATABASE_URL)
    token = mint_token(
        DATABASE_URL,
        root / "admin.token",
        user="admin",
        team="ops",
        role="admin",
        unix=ADMIN_UNIX_USER,
    )
    state = service_state_dir("replicas")
    port_a, port_b, port_front = free_port(), free_port(), free_port()
    front_url = f"https://127.0.0.1:{port_front}"  # TLS through the TCP proxy
    env = {
        **os.environ,
        "RUNYARD_DATABASE_URL": DATABASE_URL,
        "RUNYARD_PUBLIC_URL": front_url,  # workers report through the one address
        "RUNYARD_STATE_DIR": str(state),  # shared by both, like a site's /shared
        "RUNYARD_SLURM_CONF": str(slurm_cluster.slurm_conf),
        "SLURM_CONF": str(slurm_cluster.slurm_conf),
        "RUNYARD_RUN_RECONCILER": "true",
        "RUNYARD_ACCELERATOR": "cpu",
        "RUNYARD_RECONCILE_INTERVAL_S": str(RECONCILE_INTERVAL_S),
        "RUNYARD_HEARTBEAT_SUSPECT_S": "4",
        "RUNYARD_HEARTBEAT_DEAD_S": "8",
        "RUNYARD_HANG_MIN_S": "15",
        "RUNYARD_FAULT": paced_faults(),
    }
    a = ServiceProcess({**env, "RUNYARD_PORT": str(port_a)}, state, token, port_a, name="a")
    b = ServiceProcess({**env, "RUNYARD_PORT": str(port_b)}, state, token, port_b, name="b")
    a.start()
    try:
        wait_for("replica A to lead", lambda: leads(a))
    except BaseException:
        a.stop()  # a setup that fails runs no teardown: leave no replica serving
        raise
    b.start()
    with open(root / "proxy.log", "ab") as out:
        proxy = subprocess.Popen(
            proxy_argv(port_front, [port_a, port_b]), cwd=REPO_ROOT, stdout=out, stderr=out
        )
    front = ServiceProcess(env, state, token, port_front, name="front")  # never started
    wait_for("the proxy", front.healthy)
    client = front.client()
    wait_for("the nodes read from Slurm", lambda: len(client.list_nodes()) >= 8)
    nodes = [n["name"] for n in client.list_nodes()]
    agents = Agents(root / "agents", front, nodes)
    for node in nodes:
        agents.start(node)
    wait_for(
        "every agent's heartbeat", lambda: all(n["last_heartbeat_at"] for n in client.list_nodes())
    )
    yield Replicas(a, b, front, agents)
    client.set_spares(0)
    for node in client.list_nodes():
        if node["state"] in ("DRAINED", "DRAINING"):
            client.resume_node(node["name"])
    for node in list(agents.procs):
        agents.stop(node)
    for replica in (a, b):
        replica.stop()
    proxy.terminate()
    proxy.wait(timeout=10)
    postgres.drop_database(DATABASE_URL)


@pytest.mark.whole_path
def test_leader_killed_mid_recovery_the_other_replica_finishes_it(
    replicas: Replicas, slurm_cluster: DevCluster
) -> None:
    client, conf = replicas.client(), str(slurm_cluster.slurm_conf)
    assert leads(replicas.a) and not leads(replicas.b), "one reconciler leads"
    client.set_spares(1)
    spare = wait_for("a spare in the pool", lambda: client.get_spares()["members"])[0]
    run_id = client.submit_run(tiny_spec("replica-failover", steps=200))["id"]
    first = wait_for("a committed checkpoint", lambda: committed(client, run_id), timeout_s=120)[0]
    wait_for("steps past it", lambda: (client.get_run(run_id)["last_step"] or 0) >= first + 3)
    placed = client.get_run(run_id)["nodes"]
    bad = placed[1]
    bystander = next(n for n in replicas.agents.nodes if n not in placed and n != spare)

    replicas.agents.append(bad, XID_79)
    wait_for(
        "the recovery to begin (the incident opened)",
        lambda: any(i["run_id"] == run_id for i in client.list_incidents()),
        interval_s=0.05,
    )
    killed_at = time.monotonic()
    replicas.a.kill()  # SIGKILL the leader: no shutdown, no lock released by hand
    # An event written while no reconciler leads: the agent must deliver it to replica B.
    replicas.agents.append(bystander, XID_92)
    wait_for("replica B to lead", lambda: leads(replicas.b), timeout_s=30, interval_s=0.05)
    takeover_s = time.monotonic() - killed_at
    print(f"takeover: leader killed -> the other replica's first tick {takeover_s:.2f} s")

    wait_for(
        "the run to succeed", lambda: client.get_run(run_id)["state"] == "SUCCEEDED", timeout_s=240
    )
    final = client.get_run(run_id)
    assert takeover_s < TAKEOVER_BOUND_S
    assert "xid:79" in drain_reason(bad, conf)
    assert len(final["attempts"]) == 2, "the recovery submitted exactly one new attempt"
    assert len({a["slurm_job_id"] for a in final["attempts"]}) == 2
    jobs = [
        line
        for line in slurm("scontrol", "show", "job", "-o", conf=conf).splitlines()
        if f"JobName={JOB_PREFIX}-r{run_id}-" in line
    ]
    assert len(jobs) == 2, "Slurm saw exactly two jobs for the run"
    incidents = [i for i in client.list_incidents() if i["run_id"] == run_id]
    assert len(incidents) == 1 and incidents[0]["state"] == "RESOLVED"
    assert bad not in final["attempts"][1]["nodes"] and spare in final["attempts"][1]["nodes"]

    def stored(node: str, code: int) -> list[dict]:
        return [
            e for e in client.get_node(node)["events"] if e["kind"] == "xid" and e["code"] == code
        ]

    assert len(stored(bad, 79)) == 1
    wait_for("the bystander's event stored", lambda: stored(bystander, 92))
    assert len(stored(bystander, 92)) == 1, "delivered once, through the surviving replica"
    if "accounting_storage/slurmdbd" in slurm("scontrol", "show", "config", conf=conf):
        ids = ",".join(a["slurm_job_id"] for a in final["attempts"])
        listed = slurm("sacct", "-n", "-X", "-P", "-j", ids, "-o", "JobName,State", conf=conf)
        names = sorted(line.split("|")[0] for line in listed.splitlines() if line.strip())
        assert names == sorted(f"{JOB_PREFIX}-r{run_id}-a{a['id']}" for a in final["attempts"])
        print(f"sacct:\n{listed}")
