"""`runyard tracking show RUN`: a run's experiment trackers and how far their export got."""

from __future__ import annotations

import typer

from client.commands.common import call
from client.output import print_json, print_table, short_time

app = typer.Typer(help="Experiment trackers (MLflow, W&B, TensorBoard).", no_args_is_help=True)


@app.command()
def show(
    run_id: int, json: bool = typer.Option(False, "--json", help="Print JSON for scripts.")
) -> None:
    """Each tracker of the run: its run id or folder, the steps exported, the last error."""
    rows = call(lambda c: c.run_tracking(run_id))
    if json:
        return print_json(rows)
    print_table(
        None,
        ["TRACKER", "STATE", "STEPS OUT", "TRACKER RUN", "LAST EXPORT", "FAILURES", "LAST ERROR"],
        [
            (
                t["tracker"],
                t["state"],
                t["exported_step"],
                t["tracker_run_id"],
                short_time(t["last_exported_at"]),
                t["num_failures"],
                (t["last_error"] or "")[:80],
            )
            for t in rows
        ],
    )
