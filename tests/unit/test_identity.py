"""Who a run runs as, below the API: links, and the owner's program run through the real
sudoers rule by the service's real user (the dev cluster's users: client/devcluster/identity.py).

These need `runyard dev up` to have made the users `runyard`, `alice`, `bob` and `ops` and
the sudoers rule, as `make test` does before the unit tests."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from client.devcluster.identity import SERVICE_USER
from tests.conftest import REPO_ROOT, TEST_DATABASE, mint_token

# Runs a gate operation as the service's own user, as the service would: prints the answer
# (or the failure: its kind and message) as one JSON line.
AS_THE_SERVICE = """
import json, sys
from pathlib import Path
from service.config import Settings
from service.identity.gate import OwnerGate
from service.slurm.owner import OwnerAccessError, RunOwner
owner, path = sys.argv[1], Path(sys.argv[2])
gate = OwnerGate(Settings(accelerator="cpu", run_reconciler=False))
try:
    exists, data, size = gate.read_log(RunOwner(owner, "ops"), path, 0, 4096, complete=True)
    print(json.dumps({"ok": True, "text": data.decode()}))
except OwnerAccessError as exc:
    print(json.dumps({"ok": False, "failure": exc.failure.value, "message": str(exc)}))
"""


def as_the_service(owner: str, path: Path) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", AS_THE_SERVICE, owner, str(path)],
        capture_output=True,
        text=True,
        cwd=REPO_ROOT,
        user=SERVICE_USER,
        group=SERVICE_USER,
        extra_groups=[],
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    answer: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return answer


@pytest.fixture
def alices_private_file() -> Iterator[Path]:
    """A file only alice may read (her folder is 0700), in a root everyone can reach."""
    folder = Path(f"/tmp/runyard-tests/{TEST_DATABASE}-identity/alice-private")
    folder.mkdir(parents=True, exist_ok=True)
    folder.parent.chmod(0o755)
    secret = folder / "0_0_log.out"
    secret.write_text("alice's secret\n")
    shutil.chown(folder, "alice", "vision")
    shutil.chown(secret, "alice", "vision")
    folder.chmod(0o700)
    secret.chmod(0o600)
    yield secret
    shutil.rmtree(folder.parent, ignore_errors=True)


def test_the_service_reads_a_users_file_with_that_users_rights_only(
    alices_private_file: Path,
) -> None:
    """Through the one sudoers rule: as alice it reads her file; as bob the OS says no and
    the error names the path; as root (in no runas group) sudo refuses to act at all."""
    assert as_the_service("alice", alices_private_file) == {"ok": True, "text": "alice's secret\n"}
    as_bob = as_the_service("bob", alices_private_file)
    assert as_bob["failure"] == "denied" and "Permission denied" in as_bob["message"]
    assert str(alices_private_file) in as_bob["message"]
    as_root = as_the_service("root", alices_private_file)
    assert as_root["failure"] == "cannot_act" and "sudo said" in as_root["message"]
    # ...and the service itself, as its own user, cannot read it either.
    own = subprocess.run(
        ["cat", str(alices_private_file)], capture_output=True, text=True, user=SERVICE_USER
    )
    assert own.returncode != 0 and "Permission denied" in own.stderr


def test_links_refuse_root_the_service_and_unknown_users(api: Any) -> None:
    for unix, words in (
        ("root", "never run as root"),
        ("no-such-login", "no Unix user no-such-login"),
        ("Bad Name", "not a valid name"),
        (SERVICE_USER, "system account"),  # the service's own (and SlurmUser, munge, ...)
        ("nobody", "not in runyard-users"),  # a person's uid, outside the group
    ):
        refused = api.put("/v1/admin/users/carol/link", json={"unix_user": unix})
        assert refused.status_code == 422, refused.text
        assert refused.json()["detail"].startswith("unix:") and words in refused.json()["detail"]
    linked = api.put(
        "/v1/admin/users/carol/link", json={"unix_user": "bob", "slurm_account": "speech"}
    )
    assert linked.status_code == 200 and linked.json()["unix_user"] == "bob"
    assert [u["user"] for u in api.get("/v1/admin/users").json()].count("carol") == 1
    assert api.get("/v1/admin/audit").json()[-1]["action"] == "user.link"


def test_a_user_without_a_link_cannot_submit(api: Any, database_url: str, tmp_path: Path) -> None:
    token = mint_token(database_url, tmp_path / "dan.token", user="dan", team="vision", role="user")
    spec = {"name": "unlinked", "model": "tiny", "nodes": 1, "gpus_per_node": 1, "seq_len": 64,
            "global_batch": 4, "steps": 10, "checkpoint_every": 5}  # fmt: skip
    refused = api.post("/v1/runs", json=spec, headers={"Authorization": f"Bearer {token}"})
    assert refused.status_code == 403 and refused.json()["error"] == "not_linked"
    assert "runyard admin user link dan --unix" in refused.json()["detail"]


def test_a_spec_naming_a_folder_its_owner_cannot_read_is_refused_naming_it(
    api: Any, database_url: str, tmp_path: Path, alices_private_file: Path
) -> None:
    """bob's dry run names alice's private folder as data: the OS refuses bob, whatever the
    service (or root, which runs these tests) could read."""
    token = mint_token(
        database_url, tmp_path / "bob.token", user="bob", team="speech", role="user", unix="bob"
    )
    spec = {"name": "nosy", "model": "tiny", "nodes": 1, "gpus_per_node": 1, "seq_len": 64,
            "global_batch": 4, "steps": 10, "checkpoint_every": 5,
            "data": str(alices_private_file.parent)}  # fmt: skip
    refused = api.post("/v1/runs/dry-run", json=spec, headers={"Authorization": f"Bearer {token}"})
    assert refused.status_code == 422, refused.text
    detail = refused.json()["detail"]
    assert detail.startswith("data:") and "Permission denied" in detail
    assert str(alices_private_file.parent) in detail
    assert os.stat(alices_private_file).st_mode & 0o777 == 0o600  # untouched


def test_the_doctor_fails_a_service_running_as_root(api: Any, tmp_path: Path) -> None:
    """The API in this process runs as root (the tests do): the doctor must say so, with
    the fix; a settings file others may read is a failure too."""
    from client.api import RunyardClient
    from client.doctor.identity import check_identity
    from client.doctor.result import SiteSettings

    settings_file = tmp_path / "runyard.env"
    settings_file.write_text("RUNYARD_DATABASE_URL=postgresql+psycopg://secret@db/runyard\n")
    settings_file.chmod(0o644)
    client = RunyardClient("http://localhost")  # the app in-process below; loopback: a token may go
    client._http = api  # the real app in-process: TestClient is an httpx.Client
    settings = SiteSettings.load(settings_file)
    checks = {c.name: c for c in check_identity(settings, client)}
    assert checks["service user"].status == "FAIL"
    assert "runs as root" in checks["service user"].detail
    assert "User=runyard" in checks["service user"].fix
    assert checks["secrets"].status == "FAIL" and "chmod 0600" in checks["secrets"].fix
    assert checks["acts as its users"].status == "skip"


def test_the_doctor_warns_of_owners_who_may_become_root(tmp_path: Path) -> None:
    """The service may act as every member of the owner group: root, the service itself or
    a member of sudo in it makes the service as strong as them. A group of the test's own
    (the dev cluster's runyard-users stays as it is: the sudoers rule names it)."""
    import grp

    from client.doctor.identity import check_owner_group
    from client.doctor.result import SiteSettings

    name = "runyard-doctor-test"
    subprocess.run(["groupdel", name], capture_output=True)
    subprocess.run(["groupadd", name], check=True)
    try:
        subprocess.run(["gpasswd", "-M", "alice,root,runyard", name], check=True)
        settings_file = tmp_path / "runyard.env"
        settings_file.write_text(f"RUNYARD_OWNER_GROUP={name}\n")
        check = check_owner_group(SiteSettings.load(settings_file), "runyard")
        assert check.status == "warn", check
        assert f"{name} holds root, runyard:" in check.detail, check.detail
        assert "alice" not in check.detail and f"gpasswd -d root {name}" in check.fix

        subprocess.run(["gpasswd", "-M", "alice,bob", name], check=True)
        assert grp.getgrnam(name).gr_mem == ["alice", "bob"]
        check = check_owner_group(SiteSettings.load(settings_file), "runyard")
        assert check.status == "ok" and "2 users, none privileged" in check.detail, check
    finally:
        subprocess.run(["groupdel", name], check=True)


def test_the_doctor_warns_when_postgres_lets_the_service_role_in_without_a_password(
    database_url: str,
) -> None:
    """The tests' Postgres trusts 127.0.0.1, as this machine ships it: the doctor says what
    that allows, and how to close it."""
    import dataclasses

    from client.doctor.result import SiteSettings
    from client.doctor.site import check_postgres

    settings = dataclasses.replace(SiteSettings.load(None), database_url=database_url)
    checks = {c.name: c for c in check_postgres(settings)}
    guarded = checks["password required"]
    assert guarded.status == "warn" and "without a password" in guarded.detail, guarded
    assert "scram-sha-256" in guarded.fix


def clear_fault_hooks(monkeypatch: pytest.MonkeyPatch) -> None:
    for key in [k for k in os.environ if k.startswith("RUNYARD_FAULT")]:
        monkeypatch.delenv(key)


def test_fault_hooks_reach_jobs_only_from_a_dev_service(monkeypatch: pytest.MonkeyPatch) -> None:
    """What the service hands the owner's program as the job's environment (sbatch passes it
    on): the tests' RUNYARD_FAULT* hooks in dev mode, nothing from a site service (issue
    38: a hook left in one would crash or slow every user's job). Site is the default."""
    import getpass

    from service.config import Settings
    from service.identity import gate
    from service.slurm.owner import RunOwner
    from service.slurm.submit import AttemptRequest

    sent: list[dict[str, Any]] = []

    def owners_program(argv: list[str], stdin: str, timeout_s: float) -> Any:
        sent.append(json.loads(stdin))
        return subprocess.CompletedProcess(argv, 0, '{"ok": true, "result": "4242"}\n', "")

    monkeypatch.setattr(gate, "run_as_owner", owners_program)
    clear_fault_hooks(monkeypatch)
    monkeypatch.delenv("RUNYARD_ENVIRONMENT", raising=False)
    monkeypatch.setenv("RUNYARD_FAULT", "after_step:5")
    monkeypatch.setenv("RUNYARD_FAULT_SLOW_S", "0.3")
    req = AttemptRequest(
        run_id=1, attempt_id=1, job_name="runyard-x-r1-a1", job_folder=Path("/nonexistent"),
        num_nodes=1, ranks_per_node=1, time_limit_min=10,
        owner=RunOwner(unix_user=getpass.getuser(), slurm_account="ops"),
    )  # fmt: skip
    hooks = {"RUNYARD_FAULT": "after_step:5", "RUNYARD_FAULT_SLOW_S": "0.3"}
    for settings, handed in ((Settings(), {}), (Settings(environment="dev"), hooks)):
        assert gate.OwnerGate(settings).submit(req, "token") == "4242"
        assert sent[-1]["job_env"] == handed, settings.environment


def test_the_doctor_fails_a_site_service_with_fault_hooks_and_warns_of_a_dev_one(
    api: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The service reports its mode and the names of the hooks in its environment
    (GET /v1/admin/service-identity); the doctor fails a site service with one set."""
    from client.api import RunyardClient
    from client.doctor.identity import check_fault_hooks, check_identity
    from client.doctor.result import SiteSettings
    from service.admin import users
    from service.config import Settings

    client = RunyardClient("http://localhost")  # the app in-process below; loopback: a token may go
    client._http = api  # the real app in-process
    settings_file = tmp_path / "runyard.env"
    settings_file.write_text("RUNYARD_PARTITION=train\n")
    settings = SiteSettings.load(settings_file)

    def fault_hooks_check() -> Any:
        return {c.name: c for c in check_identity(settings, client)}["fault hooks"]

    clear_fault_hooks(monkeypatch)
    monkeypatch.setattr(users, "get_settings", lambda: Settings(environment="site"))
    assert fault_hooks_check().status == "ok"
    monkeypatch.setenv("RUNYARD_FAULT", "after_step:5")
    failed = fault_hooks_check()
    assert failed.status == "FAIL", failed
    assert "RUNYARD_FAULT set in the environment of a site service" in failed.detail
    assert "after_step" not in failed.detail  # names only, not what they do
    assert failed.fix.startswith("remove RUNYARD_FAULT from runyard.env")
    monkeypatch.setattr(users, "get_settings", lambda: Settings(environment="dev"))
    warned = fault_hooks_check()
    assert warned.status == "warn" and "dev mode: RUNYARD_FAULT reach every job" in warned.detail
    monkeypatch.delenv("RUNYARD_FAULT")
    assert fault_hooks_check().status == "ok"
    older = check_fault_hooks({"unix_user": "runyard", "uid": 999, "is_root": False})
    assert older.status == "skip"
