"""`runyard cluster ...`: the Slurm clusters the service drives."""

from __future__ import annotations

import typer

from client.commands.common import call
from client.output import console, hint, print_json, print_table

app = typer.Typer(help="The Slurm clusters the service drives.", no_args_is_help=True)
JSON = typer.Option(False, "--json", help="Print JSON for scripts.")


@app.command("list")
def list_(json: bool = JSON) -> None:
    """Every cluster: reachable or not, its nodes, spares, free GPUs and Slurm version."""
    clusters = call(lambda c: c.list_clusters())
    if json:
        return print_json(clusters)
    # Seven short columns: fits 80 columns with a 20-character cluster name.
    print_table(
        None,
        ["CLUSTER", "STATE", "NODES", "HEALTHY", "SPARES", "FREE GPUS", "SLURM"],
        [
            (
                c["name"] + (" *" if c["default"] else ""),
                c["state"],
                c["num_nodes"],
                c["num_healthy"],
                f"{c['num_spares']}/{c['spare_target']}",
                c["free_gpus"],
                c["slurm_version"] or "-",
            )
            for c in clusters
        ],
    )
    console.print("[dim]* the default cluster: runs that name none go there[/dim]")
    unreachable = [c for c in clusters if c["state"] != "reachable"]
    for c in unreachable:
        since = c.get("unreachable_since")
        when = f" since {since[:19].replace('T', ' ')} UTC" if since else ""
        console.print(f"{c['name']}: unreachable{when}: {c['detail']}", highlight=False)
    if unreachable:
        hint("runyard doctor; check that cluster's slurmctld (docs/operations.md)")
