"""`runyard login` and `runyard logout`: a token as who you already are on the cluster.

`login` proves your uid with MUNGE (client/munge.py), and keeps the token the service answers
with where every later command finds it (client/token_store.py); `logout` revokes it on the
service and deletes it.
"""

from __future__ import annotations

import os

import typer

from client.api import ApiError, RunyardClient
from client.commands.common import exit_for
from client.munge import CredentialError, login_credential
from client.output import Exit, console, fail, hint, print_json, short_time
from client.token_store import forget_token, save_token, saved_token, saved_token_path

JSON = typer.Option(False, "--json", help="Print JSON for scripts.")


def login(json: bool = JSON) -> None:
    """Log in as the Unix user you are, with this host's MUNGE; the token expires."""
    try:
        credential = login_credential()
    except CredentialError as exc:
        fail(str(exc), Exit.ERROR)
    client = RunyardClient()
    try:
        answer = client.log_in(credential)
    except ApiError as exc:
        fail(exc.message, exit_for(exc))
    path = save_token(answer.pop("token"))
    if json:
        return print_json({**answer, "saved_to": str(path)})
    charged = answer["slurm_account"] or f"team {answer['team']}'s account"
    console.print(
        f"logged in as {answer['user']} (team {answer['team']}) until "
        f"{short_time(answer['expires_at'])} UTC: runs run as {answer['unix_user']}, "
        f"charged to {charged}; token saved to {path}"
    )
    if os.environ.get("RUNYARD_TOKEN"):
        hint("unset RUNYARD_TOKEN: commands send it instead of this login")
    else:
        hint("runyard run submit SPEC.yaml; `runyard logout` when you are done")


def logout(json: bool = JSON) -> None:
    """Revoke the token of your last `runyard login` and delete it."""
    secret, path = saved_token(), saved_token_path()
    if secret is None:
        if json:
            return print_json({"revoked": None, "deleted": None})
        console.print(f"not logged in (no token at {path}); nothing to do")
        return None
    try:
        revoked = RunyardClient(token=secret).log_out()
    except ApiError as exc:
        if exc.status is None:
            fail(
                f"{exc.message}; the token stays saved: run `runyard logout` again",
                Exit.UNREACHABLE,
            )
        if exc.status != 401:
            fail(exc.message, Exit.ERROR)
        revoked = None  # expired or revoked already: nothing left to revoke
    forget_token()
    if json:
        return print_json({"revoked": revoked, "deleted": str(path)})
    what = f"token {revoked['id']} revoked" if revoked else "the token had expired already"
    console.print(f"logged out: {what}, {path} deleted")
    return None
