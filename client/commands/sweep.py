"""`runyard sweep ...`: grids of runs submitted as one Slurm job array (`runyard run submit`
of a spec with a `sweep:` section creates one)."""

from __future__ import annotations

from typing import Any

import typer

from client.commands.common import call, fmt_float
from client.output import console, hint, print_json, print_table, short_time

app = typer.Typer(help="Sweeps: a grid of runs as one Slurm job array.", no_args_is_help=True)
JSON = typer.Option(False, "--json", help="Print JSON for scripts.")


def _params(params: dict[str, Any]) -> str:
    return " ".join(f"{k}={v}" for k, v in params.items())


def print_sweep(sweep: dict[str, Any]) -> None:
    array = sweep["slurm_array_job_id"] or "not queued yet"
    console.print(
        f"sweep [bold]{sweep['id']}[/bold] '{sweep['name']}': {sweep['state']}, "
        f"{len(sweep['runs'])} runs, at most {sweep['max_parallel']} at once, "
        f"Slurm job array {array}"
    )
    print_table(
        None,
        ["RUN", "POINT", "NAME", "STATE", "JOB", "STEP", "LOSS", "PARAMS"],
        [
            (
                r["id"],
                r["index"],
                r["name"],
                r["state"],
                r["slurm_job_id"] or "-",
                r["last_step"] if r["last_step"] is not None else "-",
                fmt_float(r["last_loss"]),
                _params(r["params"]),
            )
            for r in sweep["runs"]
        ],
    )


@app.command("list")
def list_(json: bool = JSON) -> None:
    """Sweeps, newest first."""
    sweeps = call(lambda c: c.list_sweeps())
    if json:
        return print_json(sweeps)
    print_table(
        None,
        ["ID", "NAME", "STATE", "RUNS", "PARALLEL", "ARRAY", "CREATED"],
        [
            (
                s["id"],
                s["name"],
                s["state"],
                " ".join(f"{k.lower()}={v}" for k, v in sorted(s["counts"].items())),
                s["max_parallel"],
                s["slurm_array_job_id"] or "-",
                short_time(s["created_at"]),
            )
            for s in sweeps["items"]
        ],
    )


@app.command()
def show(sweep_id: int, json: bool = JSON) -> None:
    """One sweep: its runs, their grid points and their array tasks."""
    sweep = call(lambda c: c.get_sweep(sweep_id))
    if json:
        return print_json(sweep)
    print_sweep(sweep)


@app.command()
def cancel(sweep_id: int, json: bool = JSON) -> None:
    """Cancel every run of the sweep that is still queued or running."""
    sweep = call(lambda c: c.cancel_sweep(sweep_id))
    if json:
        return print_json(sweep)
    console.print(f"sweep {sweep['id']}: cancelling its runs")
    hint(f"runyard sweep show {sweep['id']}")
