"""One service, two real Slurm clusters (issue 41): the dev cluster and runyard-dev-b (its
own slurmctld and slurmds, the first's slurmdbd). Two runs land where the planner puts them,
one pinned; an Xid on each moves each to a spare of its own cluster; then runyard-dev-b
goes away whole (its slurmctld, its slurmds, the run's ranks, its agents: a power loss or
a maintenance window), and past the site's limit its run continues on the dev cluster
from its last trusted checkpoint, the steps trained again giving the same losses. When
runyard-dev-b comes back, the old job there is cancelled and nothing starts on it."""

from __future__ import annotations

import os
import shutil
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from client.api import ApiError, RunyardClient
from client.devcluster import cluster, multicluster
from client.devcluster.cluster import DevCluster
from client.devcluster.clusters_file import clusters_toml
from client.devcluster.processes import is_alive
from tests.conftest import wait_for
from tests.integration.conftest import (
    Agents,
    ServiceProcess,
    committed,
    ended,
    lose_a_node_and_resume,
    losses,
    service_state_dir,
    slurm,
    tiny_spec,
)

pytestmark = pytest.mark.integration

FAILOVER_AFTER_S = 15  # the site's limit here (RUNYARD_FAILOVER_AFTER_S)


@pytest.fixture
def two_clusters(
    service: ServiceProcess,
    slurm_cluster: DevCluster,
    second_cluster: DevCluster,
    agents: Agents,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[RunyardClient, Agents]]:
    """The session's service driving both clusters (a clusters file, as `dev up --clusters
    2` writes it), a spare on each, and a health agent on each of runyard-dev-b's nodes
    reporting with `--cluster`. After: the service drives the dev cluster alone again and
    forgets runyard-dev-b's rows, as a site that removed it from the file would."""
    first, second = slurm_cluster.cluster_name, second_cluster.cluster_name
    # Where the service's user reads it (pytest's own folders are root's alone).
    clusters_file = service_state_dir("clusters") / "clusters.toml"
    clusters_file.write_text(clusters_toml([first, second]))
    clusters_file.chmod(0o644)
    settings = dict(service.settings)
    service.stop()
    service.settings["RUNYARD_CLUSTERS_FILE"] = str(clusters_file)
    service.settings["RUNYARD_FAILOVER_AFTER_S"] = str(FAILOVER_AFTER_S)
    service.start()
    client = service.client()
    nodes = list(agents.nodes)
    b_agents = Agents(tmp_path_factory.mktemp("agents-b"), service, nodes, cluster=second)
    for node in nodes:
        b_agents.start(node)
    try:
        wait_for(
            f"{second}'s agents' heartbeats",
            lambda: (
                len(
                    [n for n in client.list_nodes(second) if n["last_heartbeat_at"] and n["switch"]]
                )
                == len(nodes)
            ),
        )
        for on in (first, second):
            client.set_spares(1, on)
            wait_for(f"a spare on {on}", lambda: client.get_spares(on)["members"])  # noqa: B023
        yield client, b_agents
    finally:
        b_agents.stop_all()
        if not is_alive(second_cluster.table.load()["slurmctld"]):  # a test that failed
            bring_back(slurm_cluster, second_cluster)  # while it was away
        for on in (first, second):
            client.set_spares(0, on)
            for row in client.list_nodes(on):
                if row["state"] in ("DRAINED", "DRAINING"):
                    client.resume_node(row["name"], cluster=on)
        service.stop()
        service.settings.clear()
        service.settings.update(settings)
        forget_cluster(settings["RUNYARD_DATABASE_URL"], second)
        service.start()
        shutil.rmtree(clusters_file.parent, ignore_errors=True)


def forget_cluster(database_url: str, name: str) -> None:
    """Delete the rows of a cluster the service no longer drives (its runs have ended)."""
    engine = create_engine(database_url)
    try:
        with engine.begin() as conn:
            for table in ("incidents", "runs", "node_events", "nodes"):
                conn.execute(text(f"DELETE FROM {table} WHERE cluster = :name"), {"name": name})
    finally:
        engine.dispose()


def refuse(
    client: RunyardClient, spec: dict[str, object], status: int, code: str, *words: str
) -> None:
    """The submission is refused with `status` and `code`, its detail naming `words`."""
    with pytest.raises(ApiError) as refused:
        client.submit_run(spec)
    error = refused.value
    assert error.status == status and isinstance(error.body, dict), error
    assert error.body["error"] == code, error.body
    assert all(w in error.body["detail"] for w in words), error.body["detail"]


def bring_back(first: DevCluster, member: DevCluster) -> None:
    """The powered-off cluster's slurmctld and slurmds started again, on their saved state."""
    shape = cluster.saved_shape(first)
    assert shape is not None
    multicluster.up_member(member, shape, say=lambda _: None)


def environ_of(pid: int) -> dict[str, str]:
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return {}
    pairs = (item.split(b"=", 1) for item in raw.split(b"\0") if b"=" in item)
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, v in pairs}


def parent_of(pid: int) -> int:
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0
    return int(fields[1])


def cmdline_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def power_off(member: DevCluster, job: str) -> list[int]:
    """runyard-dev-b goes away whole: its slurmctld and slurmds, and the job's processes
    (its ranks and their slurmstepd), all SIGKILLed, as a power loss leaves them. Returns
    the PIDs killed."""
    table = member.table.load()
    daemons = [
        p.pid for name, p in table.items() if name == "slurmctld" or name.startswith("slurmd")
    ]
    job_procs = [
        pid
        for pid in (int(p) for p in os.listdir("/proc") if p.isdigit())
        if (env := environ_of(pid)).get("SLURM_JOB_ID") == job
        and env.get("SLURM_CLUSTER_NAME") == member.cluster_name
    ]
    stepds = set()
    for pid in job_procs:
        up = parent_of(pid)
        while up > 1:
            if cmdline_of(up).startswith("slurmstepd"):
                stepds.add(up)
            up = parent_of(up)
    killed = []
    for pid in [*daemons, *stepds, *job_procs]:
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except ProcessLookupError:
            pass
    return killed


def test_two_runs_recover_on_their_own_clusters_and_one_fails_over_when_its_cluster_goes(
    two_clusters: tuple[RunyardClient, Agents],
    slurm_cluster: DevCluster,
    second_cluster: DevCluster,
    agents: Agents,
) -> None:
    client, b_agents = two_clusters
    first, second = slurm_cluster.cluster_name, second_cluster.cluster_name
    first_conf, second_conf = str(slurm_cluster.slurm_conf), str(second_cluster.slurm_conf)

    # Bad input, refused before anything is queued: a cluster the service does not drive,
    # and one pinned that cannot hold the spec, each named with why.
    refuse(client, tiny_spec("nowhere", cluster="nowhere"), 422, "unknown_cluster",
           "'nowhere'", f"{first}, {second}")  # fmt: skip
    refuse(client, tiny_spec("too-big", cluster=second, nodes=9, global_batch=18), 422,
           "cluster_cannot_run", f"'{second}'", "it has 8 nodes, the spec asks for 9")  # fmt: skip

    # The pinned run goes where its spec says.
    pinned = client.submit_run(tiny_spec("pinned-first", cluster=first, steps=900))
    assert pinned["cluster"] == first
    wait_for("the pinned run placed", lambda: client.get_run(pinned["id"])["nodes"])
    # The dev cluster is full for a moment (its spare pool holds every free node): the
    # planner puts the next run on runyard-dev-b, where it can start now.
    client.set_spares(6, first)
    wait_for("the first cluster's pool full", lambda: len(client.get_spares(first)["members"]) == 6)
    # Commits 100 steps apart: the cluster goes while the steps after one are reported,
    # which the other cluster then trains again.
    spec = tiny_spec("chosen", steps=2400, checkpoint_every=100)
    decided = client.dry_run_run(spec)
    assert decided["cluster"] == second, decided
    assert "start now" in decided["cluster_why"], decided["cluster_why"]
    assert {c["name"] for c in decided["clusters"]} == {first, second}
    chosen = client.submit_run(spec)
    assert chosen["cluster"] == second
    client.set_spares(1, first)
    wait_for(
        "the first cluster's pool back to 1", lambda: len(client.get_spares(first)["members"]) == 1
    )

    # An Xid on each run's node: each moves to a spare of its own cluster.
    on_a = lose_a_node_and_resume(client, pinned["id"], agents, first_conf, cluster=first)
    on_b = lose_a_node_and_resume(
        client, chosen["id"], b_agents, second_conf, commit_timeout_s=180, cluster=second
    )
    for run_id, moved, name in ((chosen["id"], on_b, second), (pinned["id"], on_a, first)):
        run = client.get_run(run_id)
        assert run["cluster"] == name and moved.spare in run["nodes"]
        assert all(a["cluster"] == name for a in run["attempts"]), run["attempts"]

    # runyard-dev-b goes away whole, once the run committed past its resume step.
    newest = wait_for(
        "a commit after the spare's resume",
        lambda: (c := max(committed(client, chosen["id"]))) > on_b.resume_step and c,
        timeout_s=120,
    )
    wait_for(  # steps past it, which the other cluster trains again
        "steps past the commit",
        lambda: (client.get_run(chosen["id"])["last_step"] or 0) >= newest + 10,
    )
    old = client.get_run(chosen["id"])["attempts"][-1]
    assert old["state"] == "RUNNING" and old["cluster"] == second
    b_agents.stop_all()
    assert power_off(second_cluster, old["slurm_job_id"])
    gone = time.monotonic()

    moved = wait_for(
        "the run to continue on the first cluster",
        lambda: (r := client.get_run(chosen["id"]))["cluster"] == first and r,
        timeout_s=180,
    )
    assert time.monotonic() - gone >= FAILOVER_AFTER_S  # it waited for the site's limit
    third = wait_for(
        "an attempt running on the first cluster",
        lambda: next(
            (
                a
                for a in client.get_run(chosen["id"])["attempts"]
                if a["cluster"] == first and a["state"] == "RUNNING"
            ),
            None,
        ),
        timeout_s=120,
    )
    # A run pinned to the silent cluster is refused at submit, saying since when.
    refuse(client, tiny_spec("pinned-b", cluster=second), 409, "cluster_unreachable",
           f"'{second}'", "has not answered since")  # fmt: skip
    trained_before = losses(client, chosen["id"], old["id"])  # every step it reported
    ended_old = next(a for a in moved["attempts"] if a["id"] == old["id"])
    assert (ended_old["state"], ended_old["stop_reason"]) == ("FAILED", "cluster_failover")
    resume = third["resume_step"]
    assert resume in committed(client, chosen["id"]) and resume > on_b.resume_step

    wait_for(
        "the steps lost with the cluster trained again on the other",
        lambda: (client.get_run(chosen["id"])["last_step"] or 0) > max(trained_before),
        timeout_s=120,
    )
    again = losses(client, chosen["id"], third["id"])
    trained_again = sorted(set(again) & set(trained_before))
    final = client.get_run(chosen["id"])
    seen = [
        (a["number"], a["cluster"], a["state"], a["stop_reason"], a["resume_step"])
        for a in final["attempts"]
    ]
    assert trained_again and min(trained_again) == resume + 1, (resume, again, seen)
    assert max(trained_again) == max(trained_before)
    for step in trained_again:
        assert again[step] == pytest.approx(trained_before[step], rel=1e-4), f"step {step}"
    assert final["num_restarts"] == final["num_hardware_restarts"] == 2  # Xid, the move
    assert final["goodput"]["lost"]["cluster_failover_s"] > 0
    [incident] = [
        i
        for i in client.list_incidents()
        if i["action"] == "FAIL_OVER" and i["run_id"] == chosen["id"]
    ]
    assert incident["cluster"] == second and incident["state"] == "RESOLVED"

    # runyard-dev-b comes back: the old job is cancelled there, nothing new starts on it.
    bring_back(slurm_cluster, second_cluster)
    wait_for(
        f"{second} reachable again",
        lambda: (
            next(c for c in client.list_clusters() if c["name"] == second)["state"] == "reachable"
        ),
        timeout_s=120,
    )
    wait_for(
        "the old job not live on the returned cluster",
        lambda: not slurm(
            "squeue", "-h", "-j", old["slurm_job_id"], "-t", "PD,R,CF,RQ", "-o", "%T",
            conf=second_conf,
        ).strip(),
        timeout_s=90,
    )  # fmt: skip
    time.sleep(5)  # a few ticks more: nothing is submitted to it again
    after = client.get_run(chosen["id"])
    assert [a["id"] for a in after["attempts"]] == [a["id"] for a in final["attempts"]]
    assert all(a["cluster"] == first for a in after["attempts"] if a["number"] > old["number"])
    live = slurm("squeue", "-h", "-t", "PD,R,CF", "-o", "%j", conf=second_conf).split()
    mine = [name for name in live if f"-r{chosen['id']}-a" in name]  # slurm/submit.job_name
    assert not mine, f"a job of the moved run is on {second} again: {mine}"

    assert client.get_run(chosen["id"])["state"] == "RUNNING"  # training on, on the first
    assert {a["cluster"] for a in client.get_run(pinned["id"])["attempts"]} == {first}
    for run_id in (chosen["id"], pinned["id"]):  # the rest of their steps prove nothing new
        try:
            client.cancel_run(run_id, now=True)
        except ApiError as exc:  # it ended meanwhile
            assert exc.status == 409 and ended(client, run_id), exc
    wait_for(
        "both runs to end",
        lambda: all(ended(client, r) for r in (chosen["id"], pinned["id"])),
        timeout_s=60,
    )
