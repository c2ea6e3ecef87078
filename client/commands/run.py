"""`runyard run ...`: submit, list, show, cancel, checkpoints, events, watch."""

from __future__ import annotations

import time
from functools import partial
from pathlib import Path
from typing import Any

import typer
import yaml

from client.api import RunyardClient
from client.commands.common import call, fmt_float
from client.output import Exit, console, fail, hint, print_json, print_table, short_time

app = typer.Typer(help="Training runs.", no_args_is_help=True)

JSON = typer.Option(False, "--json", help="Print JSON for scripts.")
TERMINAL = {"SUCCEEDED", "FAILED", "CANCELLED"}


def load_spec(path: Path) -> dict[str, Any]:
    try:
        spec = yaml.safe_load(path.read_text())
    except OSError as exc:
        fail(f"cannot read {path}: {exc.strerror}", Exit.USAGE)
    except yaml.YAMLError as exc:
        fail(f"{path} is not valid YAML: {exc}", Exit.USAGE)
    if not isinstance(spec, dict):
        fail(f"{path} must hold a mapping of run spec fields (name, model, nodes, ...)", Exit.USAGE)
    return spec


@app.command()
def submit(file: Path = typer.Argument(..., help="Run spec (YAML)."), json: bool = JSON) -> None:
    """Submit a run from a YAML spec."""
    run = call(lambda c: c.submit_run(load_spec(file)))
    if json:
        return print_json(run)
    layout = run["layout"]
    console.print(
        f"run [bold]{run['id']}[/bold] '{run['name']}' accepted: {run['state']}, "
        f"{run['num_nodes']} nodes x {run['gpus_per_node']} ranks, "
        f"dp={layout['dp']} tp={layout['tp']} pp={layout['pp']} cp={layout['cp']} "
        f"micro_batch={layout['micro_batch_size']}"
    )
    hint(f"runyard run watch {run['id']}")


@app.command("list")
def list_(
    state: str | None = typer.Option(None, help="Only runs in this state."), json: bool = JSON
) -> None:
    """Runs, newest first."""
    runs = call(lambda c: c.list_runs(state))
    if json:
        return print_json(runs)
    print_table(
        None,
        ["ID", "NAME", "STATE", "STEP", "LOSS", "TOK/S", "RESTARTS", "CREATED"],
        [
            (
                r["id"],
                r["name"],
                r["state"],
                f"{r['last_step'] or 0}/{r['total_steps']}",
                fmt_float(r["last_loss"]),
                fmt_float(r["tokens_per_s"], 0),
                f"{r['num_restarts']}/{r['max_restarts']}",
                short_time(r["created_at"]),
            )
            for r in runs["items"]
        ],
    )


@app.command()
def show(run_id: int, json: bool = JSON) -> None:
    """One run and its attempts."""
    run = call(lambda c: c.get_run(run_id))
    if json:
        return print_json(run)
    console.print(
        f"[bold]run {run['id']}[/bold] {run['name']}: {run['state']} ({run['state_reason']})"
    )
    console.print(
        f"step {run['last_step'] or 0}/{run['total_steps']}  "
        f"loss {fmt_float(run['last_loss'])}  tok/s {fmt_float(run['tokens_per_s'], 0)}"
        f"  restarts {run['num_restarts']}/{run['max_restarts']}"
    )
    layout = run["layout"]
    console.print(
        f"layout dp={layout['dp']} tp={layout['tp']} pp={layout['pp']} "
        f"cp={layout['cp']} zero={layout['zero_stage']} "
        f"micro_batch={layout['micro_batch_size']} {layout['precision']}; "
        f"nodes {', '.join(run['nodes']) or '-'}"
    )
    if plan := run.get("plan"):
        console.print(
            f"plan on {plan['hardware']}: {plan['memory_gib_per_gpu']['total']:.1f} "
            f"GiB/GPU, step {plan['step_time_s']:.3f} s, MFU {plan['mfu']:.1%}"
        )
    if (goodput := run.get("goodput")) and goodput["goodput"] is not None:
        lost = goodput["lost"]
        console.print(
            f"goodput {goodput['goodput']:.1%} of {goodput['allocated_s']:.0f} s allocated "
            f"({goodput['allocated_gpu_hours']:.3f} GPU-h); lost: recomputed "
            f"{lost['recomputed_steps_s']:.1f} s, detection {lost['detection_s']:.1f} s, "
            f"drain+resubmit {lost['drain_and_resubmit_s']:.1f} s, start-up+load "
            f"{lost['startup_and_load_s']:.1f} s, checkpoint stalls "
            f"{lost['checkpoint_stalls_s']:.1f} s; queued {goodput['queued_s']:.1f} s"
        )
    print_table(
        "attempts",
        ["#", "STATE", "JOB", "NODES", "RESUMED AT", "EXIT", "REASON"],
        [
            (
                a["number"],
                a["state"],
                a["slurm_job_id"],
                a["node_list"],
                a["resume_step"],
                a["exit_code"],
                a["end_reason"],
            )
            for a in run["attempts"]
        ],
    )


@app.command()
def cancel(run_id: int, json: bool = JSON) -> None:
    """Cancel a run (its Slurm job is stopped)."""
    run = call(lambda c: c.cancel_run(run_id))
    if json:
        return print_json(run)
    console.print(f"run {run_id}: {run['state']}")
    hint(f"runyard run show {run_id}")


@app.command()
def checkpoints(run_id: int, json: bool = JSON) -> None:
    """A run's checkpoints and their state."""
    rows = call(lambda c: c.run_checkpoints(run_id))
    if json:
        return print_json(rows)
    print_table(
        f"checkpoints of run {run_id}",
        ["STEP", "STATE", "SIZE MiB", "WRITE S", "PATH"],
        [
            (
                c["step"],
                c["state"],
                fmt_float((c["num_bytes"] or 0) / 2**20, 2),
                fmt_float(c["write_s"], 2),
                c["path"],
            )
            for c in rows
        ],
    )


@app.command()
def events(run_id: int, json: bool = JSON) -> None:
    """A run's timeline."""
    rows = call(lambda c: c.run_events(run_id))
    if json:
        return print_json(rows)
    print_table(
        f"timeline of run {run_id}",
        ["TIME", "KIND", "MESSAGE"],
        [(short_time(e["created_at"]), e["kind"], e["message"]) for e in rows],
    )


@app.command()
def watch(
    run_id: int,
    interval_s: float = typer.Option(2.0, help="Seconds between polls."),
    timeout_s: float = typer.Option(0, help="Give up after this long (0: never)."),
) -> None:
    """Follow a run: steps, loss, tokens/s and events until it ends. Exit 0 only if it succeeded."""
    last_step, last_event, started = -1, 0, time.monotonic()
    while True:
        run = call(lambda c: c.get_run(run_id))
        for e in call(partial(RunyardClient.run_events, run_id=run_id, after_id=last_event)):
            console.print(
                f"[cyan]{short_time(e['created_at'])}[/cyan] {e['message']}", highlight=False
            )
            last_event = e["id"]
        metrics = call(partial(RunyardClient.run_metrics, run_id=run_id, after_step=last_step))
        for m in metrics[-1:]:
            console.print(
                f"  step {m['step']:>6}/{run['total_steps']}  loss {m['loss']:.4f}  "
                f"tok/s {fmt_float(m['tokens_per_s'], 0)}",
                highlight=False,
            )
        if metrics:
            last_step = max(m["step"] for m in metrics)
        if run["state"] in TERMINAL:
            console.print(f"run {run_id} {run['state']}: {run['state_reason']}")
            raise typer.Exit(Exit.OK if run["state"] == "SUCCEEDED" else Exit.ERROR)
        if timeout_s and time.monotonic() - started > timeout_s:
            fail(f"run {run_id} still {run['state']} after {timeout_s:.0f} s")
        time.sleep(interval_s)
