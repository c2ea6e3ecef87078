"""A run survives hardware failures without a human: real agents, real Slurm, real drains."""

from __future__ import annotations

import os
import re
import signal
import time

import pytest

from client.api import RunyardClient
from tests.conftest import TEST_DATABASE, wait_for
from tests.integration.conftest import (
    Agents,
    ServiceProcess,
    committed,
    drain_reason,
    losses,
    slurm,
    tiny_spec,
)
from worker.train import train_loop

pytestmark = pytest.mark.integration

XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, name=python, GPU has fallen off the bus."


def running_attempt(client: RunyardClient, run_id: int, number: int) -> dict | None:
    attempts = client.get_run(run_id)["attempts"]
    if len(attempts) >= number and attempts[number - 1]["state"] == "RUNNING":
        return attempts[number - 1]
    return None


def training_past_a_commit(client: RunyardClient, run_id: int) -> int:
    first = wait_for("a committed checkpoint", lambda: committed(client, run_id))[0]
    wait_for("steps past it", lambda: (client.get_run(run_id)["last_step"] or 0) >= first + 3)
    return first


def cancel_and_wait(client: RunyardClient, run_id: int) -> None:
    """End a run whose remaining steps nothing is asserted on, freeing its nodes and the
    machine's cores for the next test."""
    client.cancel_run(run_id, now=True)
    wait_for("the run cancelled", lambda: client.get_run(run_id)["state"] == "CANCELLED")


def moved_to_the_spare(
    client: RunyardClient, run_id: int, spare: str, lost: str, detector: str, says: str
) -> None:
    """Attempt 2 runs on the spare instead of `lost`, after the one incident of the run,
    opened for `lost` by the `detector` signal alone, its message `<lost>: <says>...`."""
    second = wait_for(
        "attempt 2 running on the spare", lambda: running_attempt(client, run_id, 2), timeout_s=90
    )
    assert spare in second["nodes"] and lost not in second["nodes"]
    (incident,) = [i for i in client.list_incidents() if i["run_id"] == run_id]
    assert incident["node_name"] == lost, incident
    assert incident["signal"] == detector, incident
    assert incident["message"].startswith(f"{lost}: {says}"), incident


def test_killed_slurmd_is_found_by_slurm_and_the_spare_takes_over(
    spare_pool: RunyardClient, agents: Agents, slurm_cluster
) -> None:
    """The node's slurmd dies while its agent keeps heartbeating: only Slurm can tell (it
    marks the node DOWN once slurmd misses SlurmdTimeout, 10 s on the dev cluster:
    client/devcluster/render.py), and its verdict alone moves the run to the spare."""
    from client.devcluster import cluster
    from client.devcluster.processes import stop

    client = spare_pool
    spare = client.get_spares()["members"][0]
    run_id = client.submit_run(tiny_spec("slurmd-killed", steps=400))["id"]
    training_past_a_commit(client, run_id)
    gone = client.get_run(run_id)["nodes"][1]
    slurmd = slurm_cluster.table.load()[f"slurmd:{gone}"]
    try:
        stop(slurmd, timeout_s=0)  # SIGKILL at once; the agent on that node runs on
        moved_to_the_spare(client, run_id, spare, gone, "slurm:node_down", "Slurm reports ")
        assert client.get_node(gone)["last_heartbeat_at"], "the agent kept heartbeating"
        cancel_and_wait(client, run_id)
    finally:
        cluster.up(cluster=slurm_cluster, with_service=False, say=lambda _: None)


def test_a_silent_agent_is_a_lost_heartbeat_and_the_spare_takes_over(
    spare_pool: RunyardClient, agents: Agents, slurm_cluster
) -> None:
    """The node's agent is killed while Slurm still sees the node up: only the heartbeats can
    tell (dead after RUNYARD_HEARTBEAT_DEAD_S, 8 s in the tests' service). Restarted, the
    agent heartbeats again, and the node, drained for that alone, returns to service by
    itself once they have lasted RUNYARD_HEARTBEAT_RETURN_S (6 s here): no admin."""
    client, conf = spare_pool, str(slurm_cluster.slurm_conf)
    spare = client.get_spares()["members"][0]
    run_id = client.submit_run(tiny_spec("agent-silent", steps=400))["id"]
    training_past_a_commit(client, run_id)
    silent = client.get_run(run_id)["nodes"][1]
    agents.stop(silent, kill=True)
    try:
        moved_to_the_spare(client, run_id, spare, silent, "heartbeat:lost", "no heartbeat for ")
        state = slurm("sinfo", "-h", "-N", "-n", silent, "-o", "%T", conf=conf).strip()
        assert "down" not in state, f"Slurm saw {silent} {state}: the heartbeat was not alone"
        assert client.get_node(silent)["state"] == "DRAINED"
        cancel_and_wait(client, run_id)
    finally:
        agents.start(silent)
    wait_for(
        f"{silent} back in service",
        lambda: client.get_node(silent)["state"] == "HEALTHY",
        timeout_s=60,
    )
    state = slurm("sinfo", "-h", "-N", "-n", silent, "-o", "%T", conf=conf).strip()
    assert "drain" not in state, f"runyard returned {silent} but Slurm still has it {state}"


def test_stopped_rank_is_a_hang_and_is_restarted_without_draining(
    service: ServiceProcess, agents: Agents
) -> None:
    from client.devcluster.faults import rank_pids

    client = service.client()
    run_id = client.submit_run(tiny_spec("sigstop", steps=120))["id"]
    training_past_a_commit(client, run_id)
    first = client.get_run(run_id)["attempts"][0]
    pids = wait_for("the ranks", lambda: rank_pids(service.url, first["id"]))
    os.kill(pids[-1], 19)  # SIGSTOP: alive, silent, holding its peers in a collective

    second = wait_for(
        "attempt 2 after the hang", lambda: running_attempt(client, run_id, 2), timeout_s=90
    )
    assert sorted(second["nodes"]) == sorted(first["nodes"]), "a hang keeps the nodes"
    incident = next(i for i in client.list_incidents() if i["run_id"] == run_id)
    assert incident["kind"] == "hang" and incident["action"] == "RESTART"
    # py-spy's dump of the ranks, as it prints a frame: `function (file:line)`. The rank
    # left running waits in a collective called from the training loop.
    stacks = incident["details"].get("stacks", "")
    loop_frame = rf"\b{train_loop.__name__} \((\S*/)?worker/train\.py:\d+\)"
    assert re.search(loop_frame, stacks), f"no frame of the training loop in: {stacks[-3000:]}"
    assert all(client.get_node(n)["state"] != "DRAINED" for n in first["nodes"])
    cancel_and_wait(client, run_id)


def test_killed_rank_restarts_from_the_last_commit_without_draining(
    service: ServiceProcess, agents: Agents
) -> None:
    """A rank dies (SIGKILL), its node stays healthy: a software failure. The run restarts
    on the same nodes from its newest commit, and the steps trained twice give the same
    losses."""
    from client.devcluster.faults import rank_pids

    client = service.client()
    # Commits 60 steps apart, more than a report window holds (about 2 s of steps, 33 at
    # the tests' 60 ms pace): on a fast machine every window would otherwise end at a
    # checkpoint step, and the run never shows a step reported past its newest commit.
    # 600 steps (36 s at that pace) leave time for freezes that must be let go.
    spec = tiny_spec("sigkill-rank", steps=600, checkpoint_every=60)
    run_id = client.submit_run(spec)["id"]
    first_commit = wait_for("a committed checkpoint", lambda: committed(client, run_id))[0]
    first = client.get_run(run_id)["attempts"][0]
    pids = wait_for("the rank processes", lambda: rank_pids(service.url, first["id"]))
    assert len(pids) == 2

    # Kill once attempt 1 has reported steps past a commit, so the steps after it are
    # trained twice and their losses can be compared. Ranks report in windows of about two
    # seconds of steps, so "reported past the commit" is checked with a rank frozen
    # (SIGSTOP): its peer then waits in a collective, and neither can report or commit more
    # while the test looks. Rank 0 prints each window's last step as it closes it
    # (`step N/600 ...`): once that step is reported, nothing of attempt 1 is on its way.
    def rank0_window_delivered() -> bool:
        log = client.run_logs(run_id, attempt=1, rank=0)["text"]
        printed = [int(n) for n in re.findall(r"^step (\d+)/600 ", log, re.MULTILINE)]
        return bool(printed) and max(losses(client, run_id, first["id"]), default=0) == printed[-1]

    def frozen_past_a_commit() -> bool:
        os.kill(pids[-1], signal.SIGSTOP)
        # Each look reads rank 0's log through its owner's program (service/identity/): on
        # a loaded machine a few seconds each. A freeze that came while a window was on
        # its way, and is not seen delivered within the bound, is let go and tried again;
        # the bound stays well inside the tests' hang threshold (RUNYARD_HANG_MIN_S, 15 s),
        # past which the service ends the frozen attempt as hung.
        deadline = time.monotonic() + 8
        while not rank0_window_delivered():
            if time.monotonic() > deadline:
                os.kill(pids[-1], signal.SIGCONT)
                return False
            time.sleep(0.5)
        reported = max(losses(client, run_id, first["id"]), default=0)
        if reported > max(committed(client, run_id)):
            return True
        os.kill(pids[-1], signal.SIGCONT)
        return False

    wait_for(
        "attempt 1 frozen past its newest commit",
        frozen_past_a_commit,
        timeout_s=120,
        interval_s=0.5,
    )
    os.kill(pids[-1], signal.SIGKILL)

    second = wait_for("attempt 2", lambda: running_attempt(client, run_id, 2), timeout_s=90)
    assert sorted(second["nodes"]) == sorted(first["nodes"]), "a rank's death keeps the nodes"
    resume = second["resume_step"]
    assert resume is not None and resume >= first_commit
    wait_for(
        "the run to succeed", lambda: client.get_run(run_id)["state"] == "SUCCEEDED", timeout_s=180
    )
    final = client.get_run(run_id)
    failed = final["attempts"][0]
    assert failed["state"] == "FAILED" and failed["end_reason"]
    assert final["num_restarts"] == 1 and final["num_hardware_restarts"] == 0
    assert all(client.get_node(n)["state"] == "HEALTHY" for n in first["nodes"])
    assert not [i for i in client.list_incidents() if i["run_id"] == run_id]

    before, after = losses(client, run_id, first["id"]), losses(client, run_id, second["id"])
    assert min(after) == resume + 1, "attempt 2 must continue right after the committed step"
    overlap = sorted(set(before) & set(after))
    assert overlap, (
        "attempt 1 must have trained past the checkpoint attempt 2 resumed from: "
        f"attempt 1 reported steps {sorted(before)[-5:]}, attempt 2 resumed at {resume}"
    )
    for step in overlap:
        assert after[step] == pytest.approx(before[step], rel=1e-4), f"loss differs at {step}"


def test_service_killed_mid_recovery_finishes_it_once(
    service: ServiceProcess, spare_pool: RunyardClient, agents: Agents, slurm_cluster
) -> None:
    client, conf = spare_pool, str(slurm_cluster.slurm_conf)
    run_id = client.submit_run(tiny_spec("service-dies-mid-recovery", steps=300))["id"]
    training_past_a_commit(client, run_id)
    bad = client.get_run(run_id)["nodes"][1]

    # The Xid is written while the service is down: the agent keeps it on disk.
    service.kill()
    agents.append(bad, XID_79.format(pid=1))
    wait_for(
        "the agent to queue the event",
        lambda: "xid:79" not in drain_reason(bad, conf) and agents.kern_log(bad).stat().st_size > 0,
    )
    service.start()
    # Kill the service again as soon as the recovery has begun (the node is drained).
    wait_for(
        f"{bad} drained", lambda: "xid:79" in drain_reason(bad, conf), timeout_s=30, interval_s=0.05
    )
    service.kill()
    service.start()

    wait_for(
        "the run to succeed", lambda: client.get_run(run_id)["state"] == "SUCCEEDED", timeout_s=180
    )
    final = client.get_run(run_id)
    assert len(final["attempts"]) == 2, "the recovery submitted exactly one new attempt"
    incidents = [i for i in client.list_incidents() if i["run_id"] == run_id]
    assert len(incidents) == 1 and incidents[0]["state"] == "RESOLVED"
    wait_for("the pool refilled to its target", lambda: len(client.get_spares()["members"]) == 1)
    spare = incidents[0]["spare_node"]
    assert spare not in client.get_spares()["members"], "the used spare left the pool"
    assert sorted(final["attempts"][1]["nodes"]) == sorted(
        [n for n in final["attempts"][0]["nodes"] if n != bad] + [spare]
    )


def test_without_a_spare_the_run_waits_and_keeps_its_nodes(
    service: ServiceProcess, agents: Agents, slurm_cluster
) -> None:
    """No spare and a full cluster: the run waits, and a pending job cannot take its node."""
    client, conf = service.client(), str(slurm_cluster.slurm_conf)
    client.set_spares(0)
    run_id = client.submit_run(tiny_spec("no-spare", steps=250))["id"]
    training_past_a_commit(client, run_id)
    healthy, bad = client.get_run(run_id)["nodes"]
    free = len(slurm("sinfo", "-h", "-N", "-t", "idle", "-o", "%N", conf=conf).split())
    blocker = slurm(
        "sbatch",
        "--parsable",
        "--exclusive",
        f"-N{free}",
        f"--job-name=runyard-{TEST_DATABASE}-blocker",
        "--output=/dev/null",
        "--wrap",
        "sleep 600",
        conf=conf,
    ).strip()
    waiting = slurm(
        "sbatch",
        "--parsable",
        "--exclusive",
        "-N1",
        f"--job-name=runyard-{TEST_DATABASE}-waiting",
        "--output=/dev/null",
        "--wrap",
        "sleep 1",
        conf=conf,
    ).strip()
    try:
        wait_for(
            "the blocker to fill the cluster",
            lambda: (
                slurm("squeue", "-h", "-j", blocker, "-o", "%T", conf=conf).strip() == "RUNNING"
            ),
        )
        agents.append(bad, XID_79.format(pid=2))
        wait_for(
            "the run to say it waits",
            lambda: "waiting for 1 free" in client.get_run(run_id)["state_reason"],
            timeout_s=30,
            context=lambda: [e["message"] for e in client.run_events(run_id)][-8:],
        )
        kinds = [e["kind"] for e in client.run_events(run_id)]
        assert "recovery.no_spare" in kinds
        # Its healthy node is idle in Slurm but held by the run's reservation.
        state = slurm("squeue", "-h", "-j", waiting, "-o", "%T %N", conf=conf).strip()
        assert state.startswith("PENDING"), (
            state,
            free,
            slurm("scontrol", "show", "res", conf=conf),
            slurm("sinfo", "-N", conf=conf),
        )
        assert client.get_run(run_id)["nodes"] == [healthy]
    finally:
        slurm("scancel", blocker, conf=conf)
    resumed = wait_for(
        "the run training again once nodes are free",
        lambda: running_attempt(client, run_id, 2),
        timeout_s=180,
    )
    assert healthy in resumed["nodes"] and bad not in resumed["nodes"]
    cancel_and_wait(client, run_id)
    client.resume_node(bad)
    slurm("scancel", waiting, conf=conf)
