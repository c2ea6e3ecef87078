"""`runyard admin ...`: tokens, user links, team quotas and the audit log (admin tokens only)."""

from __future__ import annotations

import typer

from client.commands.common import call
from client.output import console, hint, print_json, print_table, short_time

app = typer.Typer(help="Tokens, users, quotas and the audit log.", no_args_is_help=True)
token_app = typer.Typer(help="API tokens.", no_args_is_help=True)
app.add_typer(token_app, name="token")
user_app = typer.Typer(help="Who each user's runs run as.", no_args_is_help=True)
app.add_typer(user_app, name="user")
JSON = typer.Option(False, "--json", help="Print JSON for scripts.")


@token_app.command("create")
def token_create(
    user: str = typer.Option(...),
    team: str = typer.Option(...),
    role: str = typer.Option(..., help="user, admin or agent"),
    node: str | None = typer.Option(None, help="The node an agent token speaks for."),
    cluster: str | None = typer.Option(
        None, help="That node's cluster (default: the service's default cluster)."
    ),
    expires_in_days: int | None = typer.Option(None),
    json: bool = JSON,
) -> None:
    """Create a token; its secret is printed this once."""
    created = call(lambda c: c.create_token(user, team, role, node, expires_in_days, cluster))
    if json:
        return print_json(created)
    console.print(f"token {created['id']} for {user} ({team}, {role}):")
    console.print(created["token"], highlight=False, soft_wrap=True)
    hint("export RUNYARD_TOKEN=<the token above>; it is not shown again")


@token_app.command("list")
def token_list(json: bool = JSON) -> None:
    """Tokens (never their secrets)."""
    rows = call(lambda c: c.list_tokens())
    if json:
        return print_json(rows)
    print_table(
        None,
        [
            "ID",
            "PREFIX",
            "USER",
            "TEAM",
            "ROLE",
            "ORIGIN",
            "NODE",
            "EXPIRES",
            "REVOKED",
            "LAST USED",
        ],
        [
            (
                t["id"],
                t["prefix"],
                t["user"],
                t["team"],
                t["role"],
                t["origin"],
                t["node_name"],
                short_time(t["expires_at"]) or "never",
                short_time(t["revoked_at"]),
                short_time(t["last_used_at"]),
            )
            for t in rows
        ],
    )


@token_app.command("revoke")
def token_revoke(token_id: int, json: bool = JSON) -> None:
    """Revoke a token at once."""
    row = call(lambda c: c.revoke_token(token_id))
    if json:
        return print_json(row)
    console.print(f"token {token_id} ({row['user']}) revoked")


@user_app.command("link")
def user_link(
    user: str,
    unix: str = typer.Option(..., help="The Unix login the user's ranks and scripts run as."),
    account: str | None = typer.Option(None, help="Slurm account (default: the user's team)."),
    json: bool = JSON,
) -> None:
    """Link a user to a Unix user and Slurm account; runs they submit from now on use them."""
    row = call(lambda c: c.link_user(user, unix, account))
    if json:
        return print_json(row)
    charged = row["slurm_account"] or "their team's account"
    console.print(f"user {user}: runs as {row['unix_user']}, charged to {charged}")
    hint("runyard admin user list")


@user_app.command("unlink")
def user_unlink(user: str, json: bool = JSON) -> None:
    """Remove a user's link: they cannot submit until linked again."""
    row = call(lambda c: c.unlink_user(user))
    if json:
        return print_json(row)
    console.print(f"user {user}: unlinked; their runs already accepted keep their identity")


@user_app.command("list")
def user_list(json: bool = JSON) -> None:
    """Linked users: who their runs run as."""
    rows = call(lambda c: c.list_users())
    if json:
        return print_json(rows)
    print_table(
        None,
        ["USER", "UNIX USER", "SLURM ACCOUNT", "LINKED BY", "UPDATED"],
        [
            (
                u["user"],
                u["unix_user"],
                u["slurm_account"] or "(team)",
                u["linked_by"],
                short_time(u["updated_at"]),
            )
            for u in rows
        ],
    )


@app.command("quota")
def quota(
    team: str, gpus: int | None = typer.Option(None, help="Omit for unlimited."), json: bool = JSON
) -> None:
    """Set a team's GPU quota."""
    row = call(lambda c: c.set_quota(team, gpus))
    if json:
        return print_json(row)
    console.print(f"team {team}: quota {row['gpu_quota'] or 'unlimited'} GPUs")


@app.command("audit")
def audit(json: bool = JSON) -> None:
    """The audit log of admin actions."""
    rows = call(lambda c: c.audit())
    if json:
        return print_json(rows)
    print_table(
        None,
        ["TIME", "ACTOR", "ACTION", "TARGET", "DETAIL"],
        [
            (
                short_time(e["at"]),
                f"{e['actor']} ({e['actor_team']})",
                e["action"],
                e["target"],
                e["detail"],
            )
            for e in rows
        ],
    )
