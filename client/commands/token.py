"""`runyard token ...`: your own tokens (an admin's view of everyone's: `runyard admin token`)."""

from __future__ import annotations

import typer

from client.commands.common import call
from client.output import console, hint, print_json, print_table, short_time

app = typer.Typer(help="Your own API tokens.", no_args_is_help=True)
JSON = typer.Option(False, "--json", help="Print JSON for scripts.")


@app.command("list")
def list_(json: bool = JSON) -> None:
    """Your tokens, newest first; * marks the one this command used."""
    rows = call(lambda c: c.own_tokens())
    if json:
        return print_json(rows)
    print_table(
        None,
        ["", "ID", "PREFIX", "ORIGIN", "TEAM", "ROLE", "EXPIRES", "REVOKED", "LAST USED"],
        [
            (
                "*" if t["current"] else "",
                t["id"],
                t["prefix"],
                t["origin"],
                t["team"],
                t["role"],
                short_time(t["expires_at"]) or "never",
                short_time(t["revoked_at"]),
                short_time(t["last_used_at"]),
            )
            for t in rows
        ],
    )


@app.command("revoke")
def revoke(token_id: int, json: bool = JSON) -> None:
    """Revoke one of your tokens at once (`runyard logout` revokes the login's)."""
    row = call(lambda c: c.revoke_own_token(token_id))
    if json:
        return print_json(row)
    console.print(f"token {token_id} ({row['origin']}, {row['team']}) revoked")
    hint("runyard token list")
