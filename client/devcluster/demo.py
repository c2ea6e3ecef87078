"""`runyard dev demo`: a real training run on two nodes, with a hot spare held, that survives
a GPU falling off the bus part-way through; then the same failure on the fast path.

The classic path: the run restarts from its last checkpoint on the spare. The fast path
(examples/tiny-demo-fast.yaml): two replica groups, each a tp 2 copy of the model on one
node of two ranks; the failed node's group is replaced on the spare and heals from the
other group, which trains through the failure. The summary shows both recoveries' goodput
side by side."""

from __future__ import annotations

import itertools
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
FAST_DEMO_SPEC = REPO_ROOT / "examples" / "tiny-demo-fast.yaml"
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
    inject_at: float | None = None  # time.monotonic() of the failure, once a commit is seen
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
        if not injected and run["state"] == "RUNNING" and _all_training(run):
            committed = _committed(client, run_id)
            if committed and inject_at is None:
                # Half a checkpoint interval after a commit, in time, so the classic path
                # has steps to recompute. Not by the reported step: a fast machine fills
                # each 2 s report window with a whole interval, so reports land on the
                # checkpoint steps themselves and the run ended before one showed more.
                inject_at = time.monotonic() + spec["checkpoint_every"] / 2 * _step_s(run, spec)
            if inject_at is not None and time.monotonic() >= inject_at:
                node = run["nodes"][-1]
                spares = ", ".join(client.get_spares()["members"]) or "none"
                line = inject_xid_79(kern_log(node), pid=os.getpid())
                console.print(
                    f"[bold red]injecting a GPU failure[/bold red] on {node} after step "
                    f"{step} (last commit at step {committed[-1]['step']}; spare "
                    f"{spares}):\n  {line}",
                    highlight=False,
                )
                injected = True
        if run["state"] in TERMINAL:
            if not injected and run["state"] == "SUCCEEDED":
                raise DemoFailed(f"run {run_id} finished before its node failure could be injected")
            return run
        time.sleep(0.5)


def _step_s(run: dict[str, Any], spec: dict[str, Any]) -> float:
    """The run's step time from its reported tokens/s (0 before its first report)."""
    tokens_per_s = run["tokens_per_s"] or 0
    return spec["global_batch"] * spec["seq_len"] / tokens_per_s if tokens_per_s else 0.0


def _all_training(run: dict[str, Any]) -> bool:
    """Every live attempt of the run (each replica group's, or the one) has trained a step,
    on more than one node: a failure then hits a run that is really training."""
    live = [a for a in run["attempts"] if a["state"] in ("PENDING", "RUNNING", "SUBMITTING")]
    return (
        len(run["nodes"]) > 1
        and bool(live)
        and all(a["state"] == "RUNNING" and a["first_step"] is not None for a in live)
    )


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
    print_attempts(run)
    for line in _recovery_lines(client, run_id):
        console.print(line, highlight=False)
    metrics = client.run_metrics(run_id, after_step=-1)
    first_loss = metrics[0]["loss"] if metrics else float("nan")
    console.print(
        f"[bold]summary[/bold]: run {run_id} {run['state']} after {len(run['attempts'])} "
        f"attempt(s), {run['num_restarts']} automatic restart(s); loss {first_loss:.3f} -> "
        f"{run['last_loss'] or float('nan'):.3f} over {run['last_step']} steps; "
        f"{sum(c['state'] == 'COMMITTED' for c in checkpoints)} checkpoints kept"
    )


def print_attempts(run: dict[str, Any]) -> None:
    """The run's attempts, in columns that fit 80 characters (why each ended as a code)."""
    print_table(
        f"attempts of run {run['id']}",
        ["#", "GROUP", "STATE", "JOB", "NODES", "FROM STEP", "WHY ENDED"],
        [
            (
                a["number"],
                "all" if a["replica_group"] is None else a["replica_group"],
                a["state"],
                a["slurm_job_id"],
                a["node_list"],
                "heal"
                if a["replica_group"] is not None and a["resume_step"] is None
                else a["resume_step"],
                a["stop_reason"],
            )
            for a in run["attempts"]
        ],
    )


# The goodput table's rows: (label, how to read it from a run's goodput).
GOODPUT_ROWS: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
    ("allocated (s)", lambda g: f"{g['allocated_s']:.1f}"),
    ("productive (s)", lambda g: f"{g['productive_s']:.1f}"),
    ("goodput", lambda g: f"{g['goodput']:.1%}"),
    ("lost: recomputed steps (s)", lambda g: f"{g['lost']['recomputed_steps_s']:.1f}"),
    ("lost: detection (s)", lambda g: f"{g['lost']['detection_s']:.1f}"),
    ("lost: drain + resubmit (s)", lambda g: f"{g['lost']['drain_and_resubmit_s']:.1f}"),
    ("lost: start + load (s)", lambda g: f"{g['lost']['startup_and_load_s']:.1f}"),
    ("lost: checkpoint stalls (s)", lambda g: f"{g['lost']['checkpoint_stalls_s']:.1f}"),
    ("lost: degraded (s)", lambda g: f"{g['lost'].get('degraded_s', 0.0):.1f}"),
]


def print_goodput(runs: dict[str, dict[str, Any]]) -> None:
    """Goodput of each run side by side, one row per figure: reads at 80 columns."""
    shown = {k: r["goodput"] for k, r in runs.items() if (r.get("goodput") or {}).get("goodput")}
    if not shown:
        return
    print_table(
        "goodput of each recovery (whole-run seconds)",
        ["", *(k.upper() for k in shown)],
        [(label, *(read(g) for g in shown.values())) for label, read in GOODPUT_ROWS],
    )


def run_fast_demo(
    client: RunyardClient,
    console: Console,
    kern_log: Callable[[str], Path],
    timeout_s: float = 600,
) -> dict[str, Any]:
    """The fast path: two replica groups of a tp 2 layout, one loses a node to an Xid 79."""
    console.print(
        "\n[bold]the fast path[/bold]: the same failure for a run of two replica groups "
        "(each a tp 2 copy of the model on one node), healed from the live group"
    )
    return run_demo(client, console, kern_log, FAST_DEMO_SPEC, True, timeout_s)


def summarize_fast(
    client: RunyardClient, console: Console, classic: dict[str, Any], fast: dict[str, Any]
) -> None:
    """What the fast path did: the surviving group trained through the failure, how many
    steps each recovery lost, and both recoveries' goodput side by side."""
    classic, fast = client.get_run(classic["id"]), client.get_run(fast["id"])
    print_attempts(fast)
    for line in _recovery_lines(client, fast["id"]):
        console.print(line, highlight=False)
    steps = {run["id"]: _steps_by_attempt(client, run["id"]) for run in (classic, fast)}
    failed = next((a for a in fast["attempts"] if a["stop_reason"] == "node_failure"), None)
    survivors = [
        a
        for a in fast["attempts"]
        if failed is not None
        and a["replica_group"] != failed["replica_group"]
        and a["number"] < failed["number"]
    ]
    if failed is not None and survivors:
        kept = steps[fast["id"]].get(survivors[0]["id"], [0])
        lost_at = max(steps[fast["id"]].get(failed["id"], [0]))
        console.print(
            f"replica group {survivors[0]['replica_group']} trained through the failure in "
            f"one attempt, steps {min(kept)} to {max(kept)}, {sum(s > lost_at for s in kept)} "
            f"of them after group {failed['replica_group']} lost its node at step {lost_at}; "
            f"steps recomputed: {_recomputed(fast, steps[fast['id']])} on the fast path, "
            f"{_recomputed(classic, steps[classic['id']])} on the classic one",
            highlight=False,
        )
    print_goodput({"classic": classic, "fast": fast})


def _steps_by_attempt(client: RunyardClient, run_id: int) -> dict[int, list[int]]:
    by_attempt: dict[int, list[int]] = {}
    for row in client.run_metrics(run_id, after_step=-1, limit=10_000):
        by_attempt.setdefault(row["attempt_id"], []).append(row["step"])
    return by_attempt


def _recomputed(run: dict[str, Any], steps: dict[int, list[int]]) -> int:
    """Steps trained twice: what an attempt reported past the step its successor resumed
    from (from disk); a replica group that heals resumes from no step and redoes none."""
    attempts = sorted(run["attempts"], key=lambda a: a["number"])
    redone = 0
    for before, after in itertools.pairwise(attempts):
        if after["resume_step"] is not None and steps.get(before["id"]):
            redone += max(0, max(steps[before["id"]]) - after["resume_step"])
    return redone


def return_drained_nodes(client: RunyardClient, console: Console) -> None:
    """Put the nodes the demo drained back into service, so running it again is safe."""
    for node in client.list_nodes():
        if node["state"] == "DRAINED" and node["slurm_reason"].startswith("runyard:"):
            client.resume_node(node["name"])
            console.print(
                f"{node['name']} returned to service (the demo's GPU failure was "
                "simulated; on a real cluster the node goes to repair first)"
            )
