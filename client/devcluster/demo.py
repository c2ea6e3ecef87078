"""`runyard dev demo`: a real training run on two nodes, with a hot spare held, that survives
a GPU falling off the bus part-way through."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml
from rich.console import Console

from client.api import RunyardClient
from client.devcluster.paths import REPO_ROOT
from client.output import print_table

DEMO_SPEC = REPO_ROOT / "examples" / "tiny-demo.yaml"
TERMINAL = ("SUCCEEDED", "FAILED", "CANCELLED")
XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, name=python, GPU has fallen off the bus."


class DemoFailed(RuntimeError):
    pass


def inject_xid_79(kern_log: Path, pid: int) -> str:
    """Append a real-format Xid 79 line to a node's kernel log, as the driver would."""
    line = XID_79.format(pid=pid)
    with kern_log.open("a") as f:
        f.write(line + "\n")
    return line


@contextmanager
def spares_held(client: RunyardClient, target: int, timeout_s: float = 30.0) -> Iterator[None]:
    """Hold `target` hot spares for the duration, then give the pool back to its old size and
    wait until Slurm has the nodes again, so a test run right after finds the cluster whole."""
    before = client.get_spares()["target"]
    client.set_spares(target)
    try:
        yield
    finally:
        client.set_spares(before)
        deadline = time.monotonic() + timeout_s
        while len(client.get_spares()["members"]) > before and time.monotonic() < deadline:
            time.sleep(0.5)


def _committed(client: RunyardClient, run_id: int) -> list[dict[str, Any]]:
    return [c for c in client.run_checkpoints(run_id) if c["state"] == "COMMITTED"]


def run_demo(
    client: RunyardClient,
    console: Console,
    kern_log: Callable[[str], Path],
    spec_path: Path = DEMO_SPEC,
    inject_failure: bool = True,
    timeout_s: float = 600,
) -> dict[str, Any]:
    """Reserve a spare, submit, follow, inject an Xid 79 once, follow to the end."""
    with spares_held(client, 1):
        return _follow(client, console, kern_log, spec_path, inject_failure, timeout_s)


def _follow(
    client: RunyardClient,
    console: Console,
    kern_log: Callable[[str], Path],
    spec_path: Path,
    inject_failure: bool,
    timeout_s: float,
) -> dict[str, Any]:
    spec = yaml.safe_load(spec_path.read_text())
    run = client.submit_run(spec)
    run_id, started = run["id"], time.monotonic()
    console.print(
        f"submitted run {run_id} ({spec['name']}): {spec['nodes']} nodes, "
        f"{spec['steps']} steps, checkpoint every {spec['checkpoint_every']}; "
        "1 hot spare held"
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
        if not injected and run["state"] == "RUNNING" and len(run["nodes"]) > 1:
            committed = _committed(client, run_id)
            if committed and step >= committed[-1]["step"] + 5:
                node = run["nodes"][-1]
                spares = ", ".join(client.get_spares()["members"]) or "none"
                line = inject_xid_79(kern_log(node), pid=os.getpid())
                console.print(
                    f"[bold red]injecting a GPU failure[/bold red] on {node} at step "
                    f"{step} (last commit at step {committed[-1]['step']}; spare "
                    f"{spares}):\n  {line}",
                    highlight=False,
                )
                injected = True
        if run["state"] in TERMINAL:
            return run
        time.sleep(1.0)


def _recovery_lines(client: RunyardClient, run_id: int) -> list[str]:
    lines = []
    for incident in [i for i in client.list_incidents() if i["run_id"] == run_id]:
        stamps = [
            incident[s]
            for s in ("signal_at", "drained_at", "submitted_at", "running_at", "first_step_at")
        ]
        if not all(stamps):
            continue
        t0, *rest = (datetime.fromisoformat(s) for s in stamps)
        drained, submitted, running, first = ((t - t0).total_seconds() for t in rest)
        lines.append(
            f"recovery of {incident['node_name']} ({incident['signal']}): drained +{drained:.1f} s,"
            f" resubmitted +{submitted:.1f} s, running +{running:.1f} s, first resumed step "
            f"+{first:.1f} s (spare {incident['spare_node']}, from step {incident['resume_step']})"
        )
    return lines


def summarize(client: RunyardClient, console: Console, run: dict[str, Any]) -> None:
    run_id = run["id"]
    run = client.get_run(run_id)
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
    for line in _recovery_lines(client, run_id):
        console.print(line, highlight=False)
    if (goodput := run.get("goodput")) and goodput["goodput"] is not None:
        lost = goodput["lost"]
        print_table(
            "goodput (seconds)",
            [
                "ALLOCATED",
                "PRODUCTIVE",
                "GOODPUT",
                "RECOMPUTED",
                "DETECTION",
                "DRAIN+RESUBMIT",
                "START+LOAD",
                "CKPT STALLS",
            ],
            [
                (
                    f"{goodput['allocated_s']:.1f}",
                    f"{goodput['productive_s']:.1f}",
                    f"{goodput['goodput']:.1%}",
                    f"{lost['recomputed_steps_s']:.1f}",
                    f"{lost['detection_s']:.1f}",
                    f"{lost['drain_and_resubmit_s']:.1f}",
                    f"{lost['startup_and_load_s']:.1f}",
                    f"{lost['checkpoint_stalls_s']:.1f}",
                )
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


def return_drained_nodes(client: RunyardClient, console: Console) -> None:
    """Put the nodes the demo drained back into service, so running it again is safe."""
    for node in client.list_nodes():
        if node["state"] == "DRAINED" and node["slurm_reason"].startswith("runyard:"):
            client.resume_node(node["name"])
            console.print(
                f"{node['name']} returned to service (the demo's GPU failure was "
                "simulated; on a real cluster the node goes to repair first)"
            )
