"""`runyard dev demo`: a real training run on two nodes that survives an injected failure."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from client.api import RunyardClient
from client.devcluster.faults import kill_rank, rank_pids
from service.config import REPO_ROOT

DEMO_SPEC = REPO_ROOT / "examples" / "tiny-demo.yaml"
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")


class DemoFailed(RuntimeError):
    pass


def _committed(client: RunyardClient, run_id: int) -> list[dict[str, Any]]:
    return [c for c in client.run_checkpoints(run_id) if c["state"] == "COMMITTED"]


def run_demo(
    client: RunyardClient,
    console: Console,
    spec_path: Path = DEMO_SPEC,
    inject_failure: bool = True,
    timeout_s: float = 600,
) -> dict[str, Any]:
    """Submit, follow, inject a failure once, follow to the end; returns the final run."""
    spec = yaml.safe_load(spec_path.read_text())
    run = client.submit_run(spec)
    run_id, started = run["id"], time.monotonic()
    console.print(
        f"submitted run {run_id} ({spec['name']}): {spec['nodes']} nodes, "
        f"{spec['steps']} steps, checkpoint every {spec['checkpoint_every']}"
    )
    last_event, last_printed, injected = 0, -1, not inject_failure
    while True:
        if time.monotonic() - started > timeout_s:
            raise DemoFailed(f"run {run_id} did not finish within {timeout_s:.0f} s")
        run = client.get_run(run_id)
        for event in client.run_events(run_id, last_event):
            last_event = event["id"]
            if event["kind"] != "checkpoint.committed":
                console.print(f"  [cyan]event[/cyan] {event['message']}", highlight=False)
        step = run["last_step"] or 0
        if step >= last_printed + 20 or (step and last_printed < 0):
            last_printed = step
            console.print(
                f"  step {step:>4}/{run['total_steps']}  loss "
                f"{run['last_loss']:.4f}  tok/s {run['tokens_per_s'] or 0:,.0f}  "
                f"checkpoints {len(_committed(client, run_id))}",
                highlight=False,
            )
        if not injected and run["state"] == "RUNNING" and run["attempts"]:
            attempt = run["attempts"][-1]
            committed = _committed(client, run_id)
            pids = rank_pids(client.url, attempt["id"])
            if committed and step >= committed[-1]["step"] + 5 and len(pids) > 1:
                node = attempt["nodes"][-1] if attempt["nodes"] else "?"
                console.print(
                    f"[bold red]injecting a node failure[/bold red]: killing the "
                    f"rank on {node} (pid {pids[-1]}) at step {step}; last commit "
                    f"at step {committed[-1]['step']}"
                )
                kill_rank(pids[-1])
                injected = True
        if run["state"] in TERMINAL:
            return run
        time.sleep(1.0)


def summarize(client: RunyardClient, console: Console, run: dict[str, Any]) -> None:
    from client.output import print_table

    run_id = run["id"]
    checkpoints = client.run_checkpoints(run_id)
    print_table(
        f"checkpoints of run {run_id}",
        ["STEP", "STATE", "MiB", "WRITE S"],
        [
            (
                c["step"],
                c["state"],
                f"{(c['num_bytes'] or 0) / 2**20:.2f}",
                f"{c['write_s'] or 0:.2f}",
            )
            for c in checkpoints
        ],
    )
    print_table(
        f"attempts of run {run_id}",
        ["#", "STATE", "JOB", "NODES", "RESUMED AT", "ENDED"],
        [
            (
                a["number"],
                a["state"],
                a["slurm_job_id"],
                a["node_list"],
                a["resume_step"],
                a["end_reason"],
            )
            for a in run["attempts"]
        ],
    )
    metrics = client.run_metrics(run_id, after_step=-1)
    first_loss = metrics[0]["loss"] if metrics else float("nan")
    console.print(
        f"[bold]summary[/bold]: run {run_id} {run['state']} after {len(run['attempts'])} "
        f"attempt(s), {run['num_restarts']} automatic restart(s); loss {first_loss:.3f} -> "
        f"{run['last_loss'] or float('nan'):.3f} over {run['last_step']} steps; "
        f"{sum(c['state'] == 'COMMITTED' for c in checkpoints)} checkpoints kept"
    )
