"""`runyard admin ...`: tokens, team quotas and the audit log (admin tokens only)."""

from __future__ import annotations

import typer

from client.commands.common import call
from client.output import console, hint, print_json, print_table, short_time

app = typer.Typer(help="Tokens, quotas and the audit log.", no_args_is_help=True)
token_app = typer.Typer(help="API tokens.", no_args_is_help=True)
app.add_typer(token_app, name="token")
JSON = typer.Option(False, "--json", help="Print JSON for scripts.")


@token_app.command("create")
def token_create(
    user: str = typer.Option(...),
    team: str = typer.Option(...),
    role: str = typer.Option(..., help="user, admin or agent"),
    node: str | None = typer.Option(None, help="The node an agent token speaks for."),
    expires_in_days: int | None = typer.Option(None),
    json: bool = JSON,
) -> None:
    """Create a token; its secret is printed this once."""
    created = call(lambda c: c.create_token(user, team, role, node, expires_in_days))
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
        ["ID", "PREFIX", "USER", "TEAM", "ROLE", "NODE", "REVOKED", "LAST USED"],
        [
            (
                t["id"],
                t["prefix"],
                t["user"],
                t["team"],
                t["role"],
                t["node_name"],
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
