"""`runyard node ...`: the cluster's nodes."""

from __future__ import annotations

import typer

from client.commands.common import call
from client.output import print_json, print_table, short_time

app = typer.Typer(help="Compute nodes.", no_args_is_help=True)


@app.command("list")
def list_(json: bool = typer.Option(False, "--json", help="Print JSON for scripts.")) -> None:
    """Every node: runyard's state, Slurm's state, switch and last heartbeat."""
    nodes = call(lambda c: c.list_nodes())
    if json:
        return print_json(nodes)
    print_table(
        None,
        ["NODE", "STATE", "SLURM", "SWITCH", "GPUS", "HEARTBEAT", "REASON"],
        [
            (
                n["name"],
                n["state"],
                n["slurm_state"],
                n["switch"],
                n["num_gpus"],
                short_time(n["last_heartbeat_at"]),
                n["slurm_reason"] or n["state_reason"],
            )
            for n in nodes
        ],
    )
