"""The live view of one run (a pure function of a snapshot, so it is tested without a
terminal) and the plain lines printed instead when stdout is not a terminal."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from rich.console import Group, RenderableType
from rich.panel import Panel
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text

from client.live.feed import RunSnapshot
from client.output import short_time

STATE_STYLE = {
    "PENDING": "yellow",
    "RUNNING": "green",
    "CANCELLING": "yellow",
    "SUCCEEDED": "bold green",
    "FAILED": "bold red",
    "CANCELLED": "magenta",
}


def event_style(kind: str) -> str:
    """Failures red, recoveries yellow, checkpoints green: what to look at first."""
    if kind.endswith((".failed", ".no_spare")) or "error" in kind:
        return "red"
    if kind.startswith("recovery.") or kind in ("run.pending", "run.cancelling"):
        return "yellow"
    if kind.startswith("checkpoint."):
        return "green"
    return ""


def duration(seconds: float | None) -> str:
    return "-" if seconds is None else str(timedelta(seconds=round(seconds)))


def percent(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}%}"


def figures(run: dict[str, Any]) -> Text:
    """Loss, throughput, MFU and goodput so far, each beside the plan's figure."""
    plan = run.get("plan") or {}
    goodput = (run.get("goodput") or {}).get("goodput")
    tokens = run["tokens_per_s"]
    mfu = run.get("mfu")
    # MFU below 0.1 % (a CPU dev cluster) needs more digits to be seen moving.
    mfu_digits = 3 if mfu is not None and mfu < 1e-3 else 1
    parts = [
        ("loss ", "-" if run["last_loss"] is None else f"{run['last_loss']:.4f}"),
        ("tok/s ", "-" if tokens is None else f"{tokens:,.0f}"),
        ("MFU ", percent(mfu, mfu_digits) + (f" (plan {plan['mfu']:.1%})" if plan else "")),
        (
            "goodput ",
            percent(goodput) + (f" (plan {plan['goodput']:.1%})" if "goodput" in plan else ""),
        ),
    ]
    text = Text()
    for i, (label, value) in enumerate(parts):
        text.append(("   " if i else "") + label, style="dim")
        text.append(value, style="bold")
    return text


def attempt_line(snapshot: RunSnapshot) -> Text:
    run, attempt = snapshot.run, snapshot.attempt
    text = Text()
    if attempt is None:
        return text.append("no attempt yet: waiting for nodes", style="yellow")
    text.append(f"attempt {attempt['number']} ", style="bold")
    text.append(attempt["state"], style=STATE_STYLE.get(attempt["state"], ""))
    text.append(f"  job {attempt['slurm_job_id'] or '-'}", style="dim")
    text.append(f"  nodes {', '.join(attempt['nodes']) or '-'}")
    if attempt["resume_step"] is not None:
        text.append(f"  resumed at step {attempt['resume_step']}", style="dim")
    text.append(
        f"  restarts {run['num_restarts']}/{run['max_restarts']}"
        f" ({run['num_hardware_restarts']} hardware)",
        style="dim",
    )
    return text


def render(snapshot: RunSnapshot, width: int = 100) -> RenderableType:
    """The whole view: progress bar with ETA, figures, attempt, last events."""
    run = snapshot.run
    total = max(run["total_steps"], 1)
    bar_row = Table.grid(padding=(0, 1), expand=True)
    bar_row.add_column(ratio=1)
    bar_row.add_column(no_wrap=True)
    done = min(snapshot.step, total)
    bar_row.add_row(
        ProgressBar(total=total, completed=done),
        Text(
            f"step {snapshot.step}/{run['total_steps']}  {done / total:.0%}  "
            f"ETA {duration(snapshot.eta_s)}",
            style="bold",
        ),
    )
    events = Table(box=None, show_header=False, padding=(0, 1), expand=True)
    events.add_column(no_wrap=True, style="cyan")
    events.add_column(no_wrap=True)
    events.add_column(ratio=1, overflow="fold")
    for e in snapshot.events:
        style = event_style(e["kind"])
        events.add_row(short_time(e["created_at"])[11:], Text(e["kind"], style=style), e["message"])
    title = Text.assemble(
        (f"run {run['id']} ", "bold"),
        (f"{run['name']} ", ""),
        (run["state"], STATE_STYLE.get(run["state"], "")),
    )
    body = Group(
        bar_row,
        figures(run),
        attempt_line(snapshot),
        Text(run["state_reason"], style="dim"),
        Text("last events", style="bold underline"),
        events,
    )
    return Panel(body, title=title, title_align="left", width=width)


def progress_line(snapshot: RunSnapshot) -> str:
    """One line per poll for logs and pipes, where a live view would be noise."""
    run = snapshot.run
    loss = "-" if run["last_loss"] is None else f"{run['last_loss']:.4f}"
    tokens = "-" if run["tokens_per_s"] is None else f"{run['tokens_per_s']:.0f}"
    return (
        f"  step {snapshot.step:>6}/{run['total_steps']}  loss {loss}  tok/s {tokens}  "
        f"ETA {duration(snapshot.eta_s)}"
    )
