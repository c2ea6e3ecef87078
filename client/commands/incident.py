"""`runyard incident ...`: failures, what each touched, how long recovery took."""

from __future__ import annotations

import typer

from client.commands.common import call, fmt_float
from client.output import print_json, print_table, short_time

app = typer.Typer(help="Failures and recoveries.", no_args_is_help=True)


@app.command("list")
def list_(
    limit: int = typer.Option(50, help="Newest first, at most this many."),
    json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Incidents, newest first."""
    rows = call(lambda c: c.list_incidents(limit))
    if json:
        return print_json(rows)
    print_table(
        None,
        ["ID", "SEEN", "SIGNAL", "NODE", "ACTION", "RUN", "SPARE", "STATE", "RECOVERY S"],
        [
            (
                i["id"],
                short_time(i["signal_at"]),
                i["signal"],
                i["node_name"],
                i["action"],
                i["run_id"],
                i["spare_node"],
                i["state"],
                fmt_float(i["recovery_s"], 1),
            )
            for i in rows
        ],
    )
