"""`runyard login` on the real cluster: alice, as the Unix user she is, logs in with the dev
cluster's MUNGE (no token from an admin), submits with the token the CLI saved, and her run
runs as her, charged to her Slurm account; once the login expires the CLI says, in one line,
to log in again.

The login goes to a second API process of the session's service (same database, same state
folder, no reconciler of its own: a site's second replica) whose login tokens live
LOGIN_TTL_S, so the test outlives one; the session's service places and submits the run.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from client.api import ApiError, RunyardClient
from tests.conftest import REPO_ROOT, TEST_DATABASE, free_port, wait_for
from tests.integration.conftest import ServiceProcess, slurm, tiny_spec
from tests.integration.test_run_as_owner import live_attempt, runs_as

pytestmark = pytest.mark.integration

# Long enough for `runyard login`, `runyard token list` and `runyard run submit` (three CLI
# starts of under a second each here since the command tree loads lazily, a few more on a
# busy CI machine), which alone use the token; short enough that the run's first attempt,
# checked with the admin's token meanwhile, takes most of it to start training (30 s made
# the test wait ~15 s more for the expiry, 60 s ~45 s).
LOGIN_TTL_S = 15
RUNYARD = Path(sys.executable).parent / "runyard"  # the virtualenv's CLI, as a user runs it


@pytest.fixture
def login_replica(service: ServiceProcess) -> Iterator[ServiceProcess]:
    """A second API process beside the session's service, with short login tokens."""
    port = free_port()
    settings = service.settings | {
        "RUNYARD_PORT": str(port),
        "RUNYARD_RUN_RECONCILER": "false",
        "RUNYARD_LOGIN_TOKEN_TTL_S": str(LOGIN_TTL_S),
    }
    replica = ServiceProcess(
        settings, Path(settings["RUNYARD_STATE_DIR"]), service.admin_token, port, name="login"
    )
    replica.start()
    yield replica
    replica.stop()


@pytest.fixture
def alice_not_linked(service: ServiceProcess) -> Iterator[None]:
    """alice before her first login: the links earlier tests made to her login (or to a
    runyard user named alice) are put aside, and put back after."""
    admin = service.client()
    kept = [u for u in admin.list_users() if "alice" in (u["unix_user"], u["user"])]
    for link in kept:
        admin.unlink_user(link["user"])
    yield
    for link in admin.list_users():
        if "alice" in (link["unix_user"], link["user"]):
            admin.unlink_user(link["user"])
    for link in kept:
        admin.link_user(link["user"], link["unix_user"], link["slurm_account"])


@pytest.fixture
def alices_home() -> Iterator[Path]:
    """A home folder of alice's own (0700), for her configuration and her run spec."""
    home = Path(f"/tmp/runyard-tests/{TEST_DATABASE}-alice-home")
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    home.parent.chmod(0o755)
    shutil.chown(home, "alice", "vision")
    home.chmod(0o700)
    yield home
    shutil.rmtree(home, ignore_errors=True)


def as_alice(home: Path, url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """`runyard ARGS` run by alice, with her home and this checkout's code; no RUNYARD_TOKEN
    and no dev cluster token to fall back on: what she sends is what she logged in for."""
    env = [
        f"PATH={os.environ['PATH']}",
        f"HOME={home}",
        f"XDG_CONFIG_HOME={home / 'config'}",
        f"RUNYARD_URL={url}",
        f"RUNYARD_CA={os.environ['RUNYARD_CA']}",  # the dev cluster's (slurm_cluster)
        f"RUNYARD_DEV_DIR={home / 'no-dev-cluster'}",
        f"PYTHONPATH={REPO_ROOT}",
    ]
    return subprocess.run(
        ["runuser", "-u", "alice", "--", "env", "-i", *env, str(RUNYARD), *args],
        capture_output=True,
        text=True,
        cwd=home,
        timeout=120,
    )


def ok(done: subprocess.CompletedProcess[str]) -> Any:
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    return json.loads(done.stdout)


@pytest.mark.whole_path
@pytest.mark.timeout(600)
def test_alice_logs_in_as_herself_runs_as_herself_and_is_told_when_the_login_expired(
    service: ServiceProcess,
    login_replica: ServiceProcess,
    alice_not_linked: None,
    alices_home: Path,
    slurm_cluster: Any,
) -> None:
    conf = str(slurm_cluster.slurm_conf)
    account = slurm("sacctmgr", "-nP", "show", "user", "alice", "format=DefaultAccount", conf=conf)
    if account.strip() != "vision":  # a dev cluster without slurmdbd (accounting.available())
        pytest.skip("needs Slurm accounting: a first login takes its account from sacctmgr")
    url = login_replica.url
    logged_in = ok(as_alice(alices_home, url, "login", "--json"))
    assert (logged_in["user"], logged_in["team"], logged_in["unix_user"]) == (
        "alice", "vision", "alice",
    )  # fmt: skip
    assert logged_in["slurm_account"] == "vision" and logged_in["linked_now"] is True
    saved = alices_home / "config" / "runyard" / "token"
    assert logged_in["saved_to"] == str(saved)
    alice = pwd.getpwnam("alice")
    for path, mode in ((saved, 0o600), (saved.parent, 0o700)):
        info = path.stat()
        assert (info.st_uid, info.st_mode & 0o777) == (alice.pw_uid, mode), path

    tokens = ok(as_alice(alices_home, url, "token", "list", "--json"))
    assert {t["user"] for t in tokens} == {"alice"}, tokens  # hers only
    current = [(t["id"], t["origin"]) for t in tokens if t["current"]]
    assert current == [(logged_in["token_id"], "login")], tokens

    spec = alices_home / "tiny.yaml"
    spec.write_text(json.dumps(tiny_spec("alice-logged-in", steps=200)))  # JSON is YAML
    shutil.chown(spec, "alice", "vision")
    run = ok(as_alice(alices_home, url, "run", "submit", str(spec), "--json"))
    admin = service.client()
    try:
        assert (run["owner"], run["team"]) == ("alice", "vision"), run
        attempt = wait_for("alice's run training", lambda: live_attempt(admin, run["id"], 1))
        runs_as(service, attempt, "alice")
        shown = slurm("squeue", "-h", "-j", attempt["slurm_job_id"], "-o", "%u,%a", conf=conf)
        assert shown.strip() == "alice,vision"
    finally:
        if admin.get_run(run["id"])["state"] not in ("SUCCEEDED", "FAILED", "CANCELLED"):
            admin.cancel_run(run["id"])

    secret = saved.read_text().strip()
    refusal = wait_for(
        "alice's login to expire",
        lambda: refused_with(RunyardClient(url, token=secret)),
        timeout_s=LOGIN_TTL_S + 30,
        interval_s=1,
    )
    assert refusal == "token_expired"
    expired = as_alice(alices_home, url, "run", "list")
    assert expired.returncode == 1, (expired.stdout, expired.stderr)  # README: refused
    assert expired.stderr == "error: your runyard login expired; run `runyard login` again\n"
    out = as_alice(alices_home, url, "logout")
    assert out.returncode == 0 and "expired already" in out.stdout, (out.stdout, out.stderr)
    assert not saved.exists()


def refused_with(client: RunyardClient) -> str | None:
    """The error code the service refuses `client`'s token with; None while it is valid."""
    try:
        client.list_runs(limit=1)
    except ApiError as exc:
        if exc.status == 401 and isinstance(exc.body, dict):
            return str(exc.body["error"])
        raise
    return None
