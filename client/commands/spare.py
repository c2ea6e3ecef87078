"""`runyard spare ...`: the hot-spare pool."""

from __future__ import annotations

import typer

from client.commands.common import call
from client.output import console, hint, print_json

app = typer.Typer(help="The hot-spare pool.", no_args_is_help=True)
JSON = typer.Option(False, "--json", help="Print JSON for scripts.")
CLUSTER = typer.Option(
    None, "--cluster", help="This cluster's pool (default: the service's default cluster)."
)


@app.command("list")
def list_(cluster: str | None = CLUSTER, json: bool = JSON) -> None:
    """The pool's target size and its members."""
    pool = call(lambda c: c.get_spares(cluster))
    if json:
        return print_json(pool)
    members = ", ".join(pool["members"]) or "none"
    held = len(pool["members"])
    console.print(f"{pool['cluster']}: target {pool['target']}, holding {held}: {members}")


@app.command("set")
def set_(
    target: int = typer.Argument(..., help="Spare nodes to hold."),
    cluster: str | None = CLUSTER,
    json: bool = JSON,
) -> None:
    """Set the pool's target size; it fills from healthy idle nodes within seconds."""
    pool = call(lambda c: c.set_spares(target, cluster))
    if json:
        return print_json(pool)
    console.print(f"{pool['cluster']}: spare pool target set to {pool['target']}")
    hint("runyard spare list")
