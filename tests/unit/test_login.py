"""`runyard login`: real MUNGE credentials from this machine's munged, decoded by the real
`unmunge`, the service in-process on a real Postgres.

The tests run as root; a credential proves the uid of whoever ran `munge`, so alice's are
made as alice (tests/fixtures/munge.py). Slurm accounting is the one part not run for real:
its slurmdbd is the dev cluster's, so a first login's default account comes from a table
here (the endpoint's `default_accounts` dependency); `sacctmgr`'s output is parsed below.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import create_engine, delete, or_, select
from sqlalchemy.orm import Session
from typer.testing import CliRunner

from client.api import RunyardClient
from client.cli import app as cli_app
from client.token_store import TokenSource, forget_token, resolve_token, save_token
from service.app import create_app
from service.auth.endpoints import default_accounts
from service.auth.service import create_token
from service.config import get_settings
from service.models import ApiToken, Role, TokenOrigin, UserLink
from service.slurm.accounts import parse_default_account
from tests.conftest import TEST_DATABASE, wait_for
from tests.fixtures.munge import another_clusters_munged, credential

# The dev cluster's accounting (client/devcluster/identity.py): each user's default account.
DEFAULT_ACCOUNTS = {"alice": "vision", "bob": "speech", "ops": "ops"}
PEOPLE = ("alice", "bob")
TWELVE_HOURS_S = 12 * 3600


@pytest.fixture(scope="module")
def accounts() -> dict[str, str]:
    return dict(DEFAULT_ACCOUNTS)


@pytest.fixture(scope="module")
def app(accounts: dict[str, str]) -> Any:
    app = create_app()
    app.dependency_overrides[default_accounts] = lambda: accounts.get
    return app


@pytest.fixture(scope="module")
def engine(database_url: str) -> Iterator[Any]:
    engine = create_engine(database_url)
    yield engine
    engine.dispose()


@pytest.fixture(autouse=True)
def nobody_linked(engine: Any) -> Iterator[None]:
    """alice and bob as before their first login: the links other tests made to them (and
    the runyard users named so) are put aside, and put back after."""
    touching = or_(UserLink.unix_user.in_(PEOPLE), UserLink.user.in_(PEOPLE))
    with Session(engine) as s, s.begin():
        kept = [
            (link.user, link.unix_user, link.slurm_account, link.linked_by)
            for link in s.scalars(select(UserLink).where(touching))
        ]
        s.execute(delete(UserLink).where(touching))
    yield
    with Session(engine) as s, s.begin():
        s.execute(delete(UserLink).where(touching))
        for user, unix_user, account, linked_by in kept:
            s.add(
                UserLink(user=user, unix_user=unix_user, slurm_account=account, linked_by=linked_by)
            )


@pytest.fixture
def settings_env(monkeypatch: pytest.MonkeyPatch) -> Iterator[pytest.MonkeyPatch]:
    """Set RUNYARD_* settings for one test (the service reads them through get_settings)."""
    get_settings.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    get_settings.cache_clear()


def log_in(app: Any, cred: str) -> Any:
    return TestClient(app).post("/v1/auth/login", json={"credential": cred})


def call(app: Any, token: str, method: str, path: str) -> Any:
    return TestClient(app).request(method, path, headers={"Authorization": f"Bearer {token}"})


def refused(response: Any, status: int, code: str) -> str:
    """The refusal's detail, once its status and code are the ones expected."""
    assert response.status_code == status, response.text
    assert response.json()["error"] == code, response.text
    detail: str = response.json()["detail"]
    return detail


def test_a_first_login_links_alice_to_her_default_account_and_answers_a_login_token(
    app: Any, engine: Any
) -> None:
    response = log_in(app, credential("alice"))
    assert response.status_code == 200, response.text
    body = response.json()
    assert (body["user"], body["team"], body["unix_user"], body["slurm_account"]) == (
        "alice", "vision", "alice", "vision",
    )  # fmt: skip
    assert body["linked_now"] is True and body["token"].startswith("ry_")
    with Session(engine) as s:
        link = s.get_one(UserLink, "alice")
        assert (link.unix_user, link.slurm_account, link.linked_by) == ("alice", "vision", "login")
        row = s.get_one(ApiToken, body["token_id"])
        assert (row.role, row.origin, row.user, row.team) == (
            Role.USER, TokenOrigin.LOGIN, "alice", "vision",
        )  # fmt: skip
        assert row.expires_at is not None
        lasts_s = (row.expires_at - row.created_at).total_seconds()
        assert abs(lasts_s - TWELVE_HOURS_S) < 5, lasts_s
    # The token works as hers; a second login keeps her link.
    assert call(app, body["token"], "GET", "/v1/runs").status_code == 200
    again = log_in(app, credential("alice")).json()
    assert (again["user"], again["team"], again["linked_now"]) == ("alice", "vision", False)


def test_a_login_already_linked_by_an_admin_gets_that_runyard_user_and_team(
    app: Any, engine: Any
) -> None:
    """The link an admin made wins over accounting; the team is the one the user's tokens
    had (an admin's token for robert, of team speech), not the account they are charged to."""
    with Session(engine) as s, s.begin():
        s.add(UserLink(user="robert", unix_user="bob", slurm_account="grant-7", linked_by="admin"))
        create_token(s, user="robert", team="speech", role=Role.USER)
    body = log_in(app, credential("bob")).json()
    assert (body["user"], body["team"], body["unix_user"], body["slurm_account"]) == (
        "robert", "speech", "bob", "grant-7",
    )  # fmt: skip
    assert body["linked_now"] is False


def test_a_replayed_credential_is_refused(app: Any) -> None:
    cred = credential("alice")
    assert log_in(app, cred).status_code == 200
    detail = refused(log_in(app, cred), 401, "credential_replayed")
    assert "Replayed credential" in detail and "used before" in detail


def test_a_credential_past_its_time_to_live_is_refused(app: Any) -> None:
    cred = credential("alice", "-t", "1")
    time.sleep(2)  # MUNGE's own clock: nothing to wait on but time
    detail = refused(log_in(app, cred), 401, "credential_expired")
    assert "Expired credential" in detail and "runyard login" in detail


def test_a_credential_older_than_the_site_allows_is_refused_though_munge_accepts_it(
    app: Any, settings_env: pytest.MonkeyPatch
) -> None:
    settings_env.setenv("RUNYARD_LOGIN_CREDENTIAL_MAX_AGE_S", "1")
    cred = credential("alice")  # munged's default TTL: 300 s
    time.sleep(2.2)
    detail = refused(log_in(app, cred), 401, "credential_too_old")
    assert "RUNYARD_LOGIN_CREDENTIAL_MAX_AGE_S" in detail


def test_a_credential_only_another_uid_may_decode_is_refused(app: Any) -> None:
    """`munge -u UID` restricts who may decode a credential: made by alice for bob's eyes
    only, the service (root here, its own user at a site) may not read it. (`munge -U UID`,
    as the brief wrote it, sets the uid a credential claims, which only root may do: root
    on a keyed host is trusted by MUNGE, Slurm and runyard alike.)"""
    detail = refused(log_in(app, credential("alice", "-u", "1002")), 401, "credential_unauthorized")
    assert "Unauthorized credential" in detail


def test_a_credential_from_a_host_with_another_key_is_refused(app: Any) -> None:
    with another_clusters_munged(Path(f"/tmp/runyard-tests/{TEST_DATABASE}-munged")) as socket:
        cred = credential("alice", "-S", str(socket))
    detail = refused(log_in(app, cred), 401, "credential_invalid")
    assert "Invalid credential" in detail and "this cluster's MUNGE key" in detail


def test_a_credential_not_made_for_a_login_is_refused(app: Any) -> None:
    detail = refused(
        log_in(app, credential("alice", payload=None)), 401, "credential_not_for_login"
    )
    assert "not made for a runyard login" in detail
    garbage = refused(log_in(app, "MUNGE:not-a-credential:"), 401, "credential_malformed")
    assert "not a MUNGE credential" in garbage


def test_roots_credential_is_refused(app: Any) -> None:
    detail = refused(log_in(app, credential("root")), 403, "login_root")
    assert "root never logs in" in detail


@pytest.mark.parametrize(
    ("who", "min_uid", "code", "words"),
    [
        ("daemon", None, "login_system_account", "uid 1 is a system account"),  # uid 1
        ("alice", "1002", "login_system_account", "RUNYARD_LOGIN_MIN_UID 1002"),  # uid 1001
        ("nobody", None, "login_not_in_owner_group", "not in runyard-users"),
    ],
)
def test_system_accounts_and_logins_outside_the_owner_group_are_refused(
    app: Any, settings_env: pytest.MonkeyPatch, who: str, min_uid: str | None, code: str, words: str
) -> None:
    if min_uid is not None:
        settings_env.setenv("RUNYARD_LOGIN_MIN_UID", min_uid)
    assert words in refused(log_in(app, credential(who)), 403, code)


def test_a_first_login_without_a_default_account_is_refused_and_links_nothing(
    app: Any, engine: Any, accounts: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delitem(accounts, "bob")
    detail = refused(log_in(app, credential("bob")), 403, "login_no_slurm_account")
    assert "sacctmgr add user bob" in detail
    with Session(engine) as s:
        assert s.get(UserLink, "bob") is None


def test_sacctmgrs_default_account_is_read() -> None:
    assert parse_default_account("vision\n") == "vision"
    assert parse_default_account("") is None  # a user accounting does not know


def test_an_expired_login_token_is_refused_saying_to_log_in_again_even_while_cached(
    app: Any, settings_env: pytest.MonkeyPatch
) -> None:
    """The principal cache keeps a principal for 60 s (auth_cache_ttl_s): a login token
    that expires sooner must be refused from its expiry on, not a minute later."""
    settings_env.setenv("RUNYARD_LOGIN_TOKEN_TTL_S", "1")
    token = log_in(app, credential("alice")).json()["token"]
    assert call(app, token, "GET", "/v1/runs").status_code == 200  # cached now
    wait_for(
        "the login token to be refused",
        lambda: call(app, token, "GET", "/v1/runs").status_code == 401,
        timeout_s=5,
        interval_s=0.05,
    )
    detail = refused(call(app, token, "GET", "/v1/runs"), 401, "token_expired")
    assert detail.startswith("your login expired at ") and "run `runyard login` again" in detail


def test_a_user_lists_and_revokes_their_own_tokens_only(
    app: Any, engine: Any, admin_token: str
) -> None:
    first = log_in(app, credential("alice")).json()
    second = log_in(app, credential("alice")).json()
    with Session(engine) as s, s.begin():
        bobs, _ = create_token(s, user="bob", team="speech", role=Role.USER)
        bobs_id = bobs.id
    listed = call(app, second["token"], "GET", "/v1/tokens").json()
    assert {t["user"] for t in listed} == {"alice"}
    ids = [t["id"] for t in listed]
    assert {first["token_id"], second["token_id"]} <= set(ids) and bobs_id not in ids
    assert [t["id"] for t in listed if t["current"]] == [second["token_id"]]
    assert {t["origin"] for t in listed} == {"login"}
    # Bob's token does not exist, as far as alice can tell; her own first one she revokes.
    refused(call(app, second["token"], "DELETE", f"/v1/tokens/{bobs_id}"), 404, "not_found")
    revoked = call(app, second["token"], "DELETE", f"/v1/tokens/{first['token_id']}")
    assert revoked.status_code == 200 and revoked.json()["revoked_at"]
    assert call(app, first["token"], "GET", "/v1/runs").status_code == 401
    # An admin revokes anyone's; logging out revokes the token it is made with.
    assert call(app, admin_token, "DELETE", f"/v1/tokens/{bobs_id}").status_code == 200
    assert call(app, second["token"], "POST", "/v1/auth/logout").json()["revoked_at"]
    assert call(app, second["token"], "GET", "/v1/runs").status_code == 401
    # The admin's list shows where each token came from.
    everyone = {t["id"]: t for t in call(app, admin_token, "GET", "/v1/admin/tokens").json()}
    assert everyone[second["token_id"]]["origin"] == "login"
    assert everyone[bobs_id]["origin"] == "admin"
    with Session(engine) as s:
        assert s.get_one(ApiToken, bobs_id).revoked_at is not None


# The CLI: where it keeps the login's token, and what it says when the service refuses it.


@pytest.fixture
def cli(app: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[Path]:
    """`runyard` commands against the app in-process (TestClient is an httpx.Client), with
    a configuration folder of their own and no other token to fall back on. Yields the
    folder the login's token is saved in."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.setenv("RUNYARD_DEV_DIR", str(tmp_path / "no-dev-cluster"))
    monkeypatch.delenv("RUNYARD_TOKEN", raising=False)
    made = RunyardClient.__init__

    def on_the_app(self: RunyardClient, *args: Any, **kwargs: Any) -> None:
        made(self, *args, **kwargs)
        in_process: Any = TestClient(app, headers=dict(self._http.headers))
        self._http = in_process

    monkeypatch.setattr(RunyardClient, "__init__", on_the_app)
    yield tmp_path / "config" / "runyard"


def runyard(*args: str) -> Any:
    return CliRunner().invoke(cli_app, list(args))


def test_the_saved_token_is_its_owners_alone_and_comes_after_runyard_token(
    cli: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cli.mkdir(parents=True, mode=0o755)  # made earlier by something else, open to all
    path = save_token("ry_saved")
    assert path == cli / "token" and path.read_text() == "ry_saved\n"
    assert (cli.stat().st_mode & 0o777, path.stat().st_mode & 0o777) == (0o700, 0o600)
    assert resolve_token() == ("ry_saved", TokenSource.LOGIN)
    monkeypatch.setenv("RUNYARD_TOKEN", "ry_from_env")
    assert resolve_token() == ("ry_from_env", TokenSource.ENVIRONMENT)
    monkeypatch.delenv("RUNYARD_TOKEN")
    dev = Path(os.environ["RUNYARD_DEV_DIR"])
    dev.mkdir()
    (dev / "admin.token").write_text("ry_dev_admin\n")
    assert resolve_token() == ("ry_saved", TokenSource.LOGIN)  # the login before the dev's
    assert forget_token() and resolve_token() == ("ry_dev_admin", TokenSource.DEV_CLUSTER)


def test_the_cli_says_in_one_line_that_the_login_expired(
    app: Any, cli: Path, settings_env: pytest.MonkeyPatch
) -> None:
    settings_env.setenv("RUNYARD_LOGIN_TOKEN_TTL_S", "1")
    token = log_in(app, credential("alice")).json()["token"]
    save_token(token)
    wait_for(
        "the login token to expire",
        lambda: call(app, token, "GET", "/v1/runs").status_code == 401,
        timeout_s=5,
        interval_s=0.05,
    )
    done = runyard("run", "list")
    assert done.exit_code == 1, done.output  # README: 1, refused
    assert done.output == "error: your runyard login expired; run `runyard login` again\n"


def test_runyard_logout_revokes_the_saved_token_and_deletes_it(app: Any, cli: Path) -> None:
    token = log_in(app, credential("alice")).json()["token"]
    save_token(token)
    assert runyard("run", "list").exit_code == 0  # the saved login is what the CLI sends
    done = runyard("logout")
    assert done.exit_code == 0 and "revoked" in done.output, done.output
    assert not (cli / "token").exists()
    assert call(app, token, "GET", "/v1/runs").status_code == 401
    assert runyard("logout").exit_code == 0  # nothing left to do: not an error


def test_runyard_login_as_root_is_refused_in_one_line_and_saves_nothing(cli: Path) -> None:
    done = runyard("login")  # the tests run as root: the CLI's own munge proves uid 0
    assert done.exit_code == 1
    assert done.output.startswith("error: root never logs in") and done.output.count("\n") == 1
    assert not (cli / "token").exists()
