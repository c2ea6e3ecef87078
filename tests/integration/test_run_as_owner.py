"""Every run runs as its owner: two users of two teams on the real cluster, read from live
processes, squeue, sacct and the files their runs write; one of them trying to reach what
is not theirs, refused by the OS and by Slurm, not by a list the service keeps.

The dev cluster's users (client/devcluster/identity.py): alice (team and Slurm account
vision) and bob (speech), both in runyard-users; the service runs as `runyard`.
"""

from __future__ import annotations

import os
import pwd
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest

from client.api import ApiError, RunyardClient
from client.devcluster.faults import rank_pids
from client.devcluster.identity import SERVICE_USER
from service.clusters.registry import default_cluster
from service.config import Settings
from service.identity.gate import OwnerGate
from service.reconcile.submission import check_submitted
from service.slurm.cli import CliSlurmClient
from service.slurm.owner import OwnerAccessError, RunOwner
from service.slurm.submit import AttemptRequest
from tests.conftest import REPO_ROOT, TEST_DATABASE, wait_for
from tests.integration.conftest import (
    Agents,
    ServiceProcess,
    drain_reason,
    slurm,
    tiny_spec,
)

pytestmark = pytest.mark.integration

XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, name=python, GPU has fallen off the bus."
INTRUDER = REPO_ROOT / "tests" / "fixtures" / "scripts" / "intruder.py"
TEAMS = {"alice": "vision", "bob": "speech"}


def user_client(service: ServiceProcess, user: str) -> RunyardClient:
    """A token of `user` in their team, the user linked to their own login."""
    admin = service.client()
    admin.link_user(user, user)
    token = admin.create_token(user=user, team=TEAMS[user], role="user")["token"]
    return service.client(token)


def uid_of(pid: int) -> int:
    """The real uid of a live process, as the kernel has it."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(re.search(r"^Uid:\s+(\d+)", status, re.M).group(1))  # type: ignore[union-attr]


def live_attempt(client: RunyardClient, run_id: int, number: int) -> dict[str, Any] | None:
    attempts = client.get_run(run_id)["attempts"]
    if len(attempts) >= number and attempts[number - 1]["state"] == "RUNNING":
        return attempts[number - 1]
    return None


def runs_as(service: ServiceProcess, attempt: dict[str, Any], user: str) -> None:
    """Every rank of the attempt is a live process of `user`."""
    pids = wait_for("the ranks", lambda: rank_pids(service.url, attempt["id"]))
    assert {uid_of(p) for p in pids} == {pwd.getpwnam(user).pw_uid}, (user, pids)


@pytest.fixture
def alices_private_data() -> Iterator[Path]:
    """A folder of alice's that only she may read."""
    folder = Path(f"/tmp/runyard-tests/{TEST_DATABASE}-alice-private")
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "hf").mkdir(parents=True)
    (folder / "index.json").write_text('{"format": 1}')
    (folder / "hf" / "config.json").write_text('{"model_type": "llama"}')
    for path in (folder, folder / "hf", folder / "index.json", folder / "hf" / "config.json"):
        shutil.chown(path, "alice", "vision")
    folder.chmod(0o700)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


# In make test-all only: its paths are make test's elsewhere (an Xid onto a spare:
# test_observability; a run as its owner, in her account: test_login; no reach beyond the
# owner's runs: the probes below).
@pytest.mark.timeout(600)
def test_two_teams_runs_run_as_their_owners_and_both_recover_onto_a_spare(
    service: ServiceProcess, agents: Agents, slurm_cluster: Any
) -> None:
    conf = str(slurm_cluster.slurm_conf)
    admin = service.client()
    admin.set_spares(2)
    wait_for("two spares", lambda: len(admin.get_spares()["members"]) == 2)
    clients = {user: user_client(service, user) for user in TEAMS}
    runs: dict[str, int] = {}
    try:
        for user, client in clients.items():
            runs[user] = client.submit_run(tiny_spec(f"owned-{user}", steps=400))["id"]
        for user, client in clients.items():
            check_owned(service, client, runs[user], user, conf)
        # Each loses a node to an Xid 79 and resumes on a spare, still as its owner.
        for user, client in clients.items():
            bad = client.get_run(runs[user])["nodes"][1]
            agents.append(bad, XID_79.format(pid=os.getpid()))
            wait_for(
                f"{bad} drained",
                lambda b=bad: "xid:79" in drain_reason(b, conf),
                timeout_s=30,
                context=lambda: (admin.list_incidents()[-3:], service.log.read_text()[-3000:]),
            )
        for user, client in clients.items():
            second = wait_for(
                f"{user}'s attempt 2",
                lambda c=client, r=runs[user]: live_attempt(c, r, 2),
                timeout_s=120,
            )
            runs_as(service, second, user)
            first_nodes = client.get_run(runs[user])["attempts"][0]["nodes"]
            assert set(second["nodes"]) - set(first_nodes), "the run moved onto a spare"
        jobs = ",".join(_job_ids(clients, runs))
        accounted = slurm("sacct", "-n", "-X", "-P", "-o", "JobID,User,Account", "-j", jobs,
                          conf=conf).split()  # fmt: skip
        assert {tuple(line.split("|")[1:]) for line in accounted} == set(TEAMS.items()), accounted
    finally:
        for run_id in runs.values():
            if admin.get_run(run_id)["state"] not in ("SUCCEEDED", "FAILED", "CANCELLED"):
                admin.cancel_run(run_id)
        admin.set_spares(0)
        for node in admin.list_nodes():
            if node["state"] in ("DRAINED", "DRAINING"):
                admin.resume_node(node["name"])


def check_owned(
    service: ServiceProcess, client: RunyardClient, run_id: int, user: str, conf: str
) -> None:
    """The run's ranks, its Slurm job and its checkpoint folder are `user`'s."""
    first = wait_for(f"{user}'s run training", lambda: live_attempt(client, run_id, 1))
    runs_as(service, first, user)
    shown = slurm("squeue", "-h", "-j", first["slurm_job_id"], "-o", "%u,%a", conf=conf)
    assert shown.strip() == f"{user},{TEAMS[user]}"
    commit = wait_for("a commit", lambda: client.run_checkpoints(run_id))[0]
    folder = os.stat(Path(commit["path"]).parent)
    entry = pwd.getpwnam(user)
    assert (folder.st_uid, folder.st_gid) == (entry.pw_uid, entry.pw_gid)
    assert folder.st_mode & 0o777 == 0o750, oct(folder.st_mode)  # the team reads, no one else


def _job_ids(clients: dict[str, RunyardClient], runs: dict[str, int]) -> list[str]:
    return [
        a["slurm_job_id"]
        for user, client in clients.items()
        for a in client.get_run(runs[user])["attempts"]
        if a["slurm_job_id"]
    ]


def test_a_run_naming_another_users_private_folder_is_refused_with_the_path(
    service: ServiceProcess, alices_private_data: Path
) -> None:
    bob = user_client(service, "bob")
    before = {p: p.read_bytes() for p in alices_private_data.rglob("*") if p.is_file()}
    for field, spec in (
        ("data", tiny_spec("nosy-data", data=str(alices_private_data))),
        ("model.from_hf", tiny_spec("nosy-hf", model={"from_hf": str(alices_private_data / "hf")})),
    ):
        with pytest.raises(ApiError) as refused:
            bob.submit_run(spec)
        assert refused.value.status == 422, refused.value.message
        detail = refused.value.body["detail"]
        assert detail.startswith(f"{field}:") and "Permission denied" in detail, detail
        assert str(alices_private_data) in detail
    assert {p: p.read_bytes() for p in alices_private_data.rglob("*") if p.is_file()} == before


@pytest.mark.whole_path
@pytest.mark.every_slurm
@pytest.mark.timeout(600)
def test_a_users_script_cannot_reach_another_teams_jobs_the_cluster_or_the_services_secrets(
    service: ServiceProcess, slurm_cluster: Any
) -> None:
    conf = str(slurm_cluster.slurm_conf)
    alice, bob = user_client(service, "alice"), user_client(service, "bob")
    theirs = alice.submit_run(tiny_spec("alices-own", steps=150, checkpoint_every=50))["id"]
    attempt = wait_for("alice's run training", lambda: live_attempt(alice, theirs, 1))
    reservation = _reservation_of(attempt, conf)
    token_copy = service.settings_file.parent / "admin.token"  # where a site keeps it
    token_copy.write_text(service.admin_token)
    shutil.chown(token_copy, SERVICE_USER, SERVICE_USER)
    token_copy.chmod(0o600)
    args = [attempt["slurm_job_id"], attempt["nodes"][0], reservation,
            str(service.settings_file), str(token_copy), str(REPO_ROOT / ".venv")]  # fmt: skip
    spec = tiny_spec(
        "intruder", nodes=1, max_restarts=0, entrypoint={"script": str(INTRUDER), "args": args}
    )
    intruder = bob.submit_run(spec)["id"]
    wait_for(
        "bob's script to end",
        lambda: bob.get_run(intruder)["state"] in ("SUCCEEDED", "FAILED"),
        timeout_s=180,
    )
    log = bob.run_logs(intruder, attempt=1, rank=0)["text"]
    lines = [line for line in log.splitlines() if line.startswith(("REFUSED", "ALLOWED"))]
    assert f"running as uid {pwd.getpwnam('bob').pw_uid}" in log, log[-2000:]
    assert len(lines) == 6 and all(line.startswith("REFUSED") for line in lines), log[-3000:]
    assert not list((REPO_ROOT / ".venv" / "lib").glob("python*/site-packages/intruder.pth"))
    wait_for(
        "alice's run to finish untouched",
        lambda: alice.get_run(theirs)["state"] == "SUCCEEDED",
        timeout_s=240,
    )
    final = alice.get_run(theirs)
    assert len(final["attempts"]) == 1 and final["last_step"] == 150
    assert "intruder" not in drain_reason(attempt["nodes"][0], conf)


def sbatch_as(user: str, name: str, conf: str) -> str:
    """A job of `user`'s own, submitted by them (not through runyard): its id."""
    done = subprocess.run(
        ["sbatch", "--parsable", "-J", name, "-N1", "-t", "5", "-o", "/dev/null",
         "--chdir=/tmp", "--wrap", "sleep 300"],
        capture_output=True, text=True, env={**os.environ, "SLURM_CONF": conf}, user=user,
        timeout=30,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout.strip().split(";")[0]


def test_an_answer_naming_bobs_job_is_refused_and_alices_scancel_leaves_it(
    slurm_cluster: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 38 against the real slurmctld: bob queues a job of his own; the owner's program
    of alice's attempt answers with its id (a tampered answer, which the gate below stands
    in for). scontrol shows it runs as bob, so the answer is refused, nothing recorded; and
    the scancel the service issues for alice's runs (--user=alice) leaves bob's job alone,
    where the same scancel as bob's cancels it."""
    conf = str(slurm_cluster.slurm_conf)
    monkeypatch.setenv("SLURM_CONF", conf)  # the service's Slurm commands read it
    bobs = sbatch_as("bob", "bobs-own", conf)
    try:
        settings = Settings(accelerator="cpu", run_reconciler=False)
        cluster = default_cluster(settings)  # the dev cluster, reached through SLURM_CONF
        slurm_client = CliSlurmClient(settings, OwnerGate(settings, cluster), cluster)
        forged = mock.patch.object(slurm_client.owner_gate, "submit", return_value=bobs)
        with forged, pytest.raises(OwnerAccessError, match=f"job {bobs}, which runs as bob"):
            answer = slurm_client.submit(AttemptRequest(
                run_id=0, attempt_id=0, job_name="runyard-alices-attempt",
                job_folder=Path("/nonexistent"), num_nodes=1, ranks_per_node=1,
                time_limit_min=5, owner=RunOwner(unix_user="alice", slurm_account="vision"),
            ), "token")  # fmt: skip
            check_submitted(slurm_client, answer, "alice", "runyard-alices-attempt")
        slurm_client.cancel({bobs: "alice"})
        shown = slurm("squeue", "-h", "-j", bobs, "-o", "%u %T", conf=conf).split()
        assert shown[:1] == ["bob"] and shown[1] in ("PENDING", "RUNNING"), shown
        slurm_client.cancel({bobs: "bob"})
        wait_for(
            "bob's job cancelled by a scancel as bob's",
            lambda: "CANCELLED" in slurm("scontrol", "show", "job", bobs, conf=conf),
        )
    finally:
        slurm("scancel", bobs, conf=conf)


def _reservation_of(attempt: dict[str, Any], conf: str) -> str:
    """The reservation alice's job runs in, as Slurm shows it."""
    shown = slurm("scontrol", "show", "job", attempt["slurm_job_id"], conf=conf)
    found = re.search(r"Reservation=(\S+)", shown)
    assert found and found.group(1) != "(null)", shown
    return found.group(1)
