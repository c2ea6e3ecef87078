"""The report's plots as PNG bytes (matplotlib's Agg backend: no display needed)."""

from __future__ import annotations

import io
from collections.abc import Callable
from datetime import datetime
from typing import Any

import matplotlib

matplotlib.use("Agg")  # before pyplot: a CLI on a headless login node has no display

import matplotlib.pyplot as plt
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import EngFormatter, PercentFormatter

from client.report.data import ReportData, parse_time

FAILURE = "#d62728"
LOST_COLOURS = {
    "productive": "#2ca02c",
    "recomputed steps": "#d62728",
    "detection": "#ff7f0e",
    "drain + resubmit": "#9467bd",
    "start-up + load": "#8c564b",
    "checkpoint stalls": "#7f7f7f",
}
PHASES = [  # (label, start stamps in order of preference, end stamp), as the service's metric
    ("detect", ("signal_at",), "detected_at"),
    ("drain", ("detected_at",), "drained_at"),
    ("stop attempt", ("drained_at", "detected_at"), "attempt_ended_at"),
    ("resubmit", ("attempt_ended_at",), "submitted_at"),
    ("start job", ("submitted_at",), "running_at"),
    ("first step", ("running_at",), "first_step_at"),
]


def png(draw: Callable[[Figure], None], size: tuple[float, float] = (9, 4)) -> bytes:
    fig = plt.figure(figsize=size, dpi=100)
    try:
        draw(fig)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        return buf.getvalue()
    finally:
        plt.close(fig)


def _failed(data: ReportData) -> list[dict[str, Any]]:
    return [a for a in data.run["attempts"] if a["state"] == "FAILED"]


def loss_vs_tokens(data: ReportData) -> bytes:
    """One line per attempt, so steps recomputed after a failure show as an overlap."""
    signals = {i["attempt_id"]: i["signal"] for i in data.incidents}

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        per_step = data.tokens_per_step
        for attempt in data.run["attempts"]:
            rows = [m for m in data.metrics if m["attempt_id"] == attempt["id"]]
            if not rows:
                continue
            xs = [m["step"] * per_step for m in rows]
            ax.plot(xs, [m["loss"] for m in rows], lw=1.2, label=f"attempt {attempt['number']}")
            if attempt["state"] == "FAILED":
                ax.axvline(xs[-1], color=FAILURE, ls="--", lw=1)
                label = signals.get(attempt["id"]) or "failed"
                ax.annotate(
                    label,
                    (xs[-1], rows[-1]["loss"]),
                    xytext=(4, 12),
                    textcoords="offset points",
                    color=FAILURE,
                )
                ax.plot(xs[-1], rows[-1]["loss"], "x", color=FAILURE, ms=9, mew=2)
        ax.set_xlabel("tokens trained")
        ax.set_ylabel("loss")
        ax.xaxis.set_major_formatter(EngFormatter())
        ax.set_title("Loss against tokens (dashed: failures)")
        ax.grid(alpha=0.3)
        if data.metrics:
            ax.legend(loc="upper right")

    return png(draw)


def _minutes(t: datetime, t0: datetime) -> float:
    return (t - t0).total_seconds() / 60


def throughput(data: ReportData) -> bytes:
    """Tokens/s over wall-clock time with MFU on the right axis; recoveries shaded."""
    times = [t for m in data.metrics if (t := parse_time(m["recorded_at"])) is not None]
    t0 = min(times, default=None)
    ratio = data.mfu_per_token_per_s

    def draw(fig: Figure) -> None:
        ax: Axes = fig.add_subplot()
        if t0 is not None:
            for attempt in data.run["attempts"]:
                rows = [m for m in data.metrics if m["attempt_id"] == attempt["id"]]
                rows = [m for m in rows if m["tokens_per_s"]]
                times = [_minutes(parse_time(m["recorded_at"]) or t0, t0) for m in rows]
                if rows:
                    ax.plot(times, [m["tokens_per_s"] for m in rows], ".", ms=3)
            for attempt in _failed(data):
                end = parse_time(attempt["ended_at"])
                nxt = next(
                    (a for a in data.run["attempts"] if a["number"] > attempt["number"]), None
                )
                resumed = parse_time(nxt["first_step_at"]) if nxt else None
                if end is not None:
                    ax.axvspan(
                        _minutes(end, t0),
                        _minutes(resumed or end, t0) + 0.01,
                        color=FAILURE,
                        alpha=0.2,
                        label="recovery",
                    )
        ax.set_xlabel("minutes since the first step")
        ax.set_ylabel("tokens/s")
        ax.yaxis.set_major_formatter(EngFormatter())
        if ratio:

            def to_mfu(tokens: Any) -> Any:
                return tokens * ratio

            def to_tokens(mfu: Any) -> Any:
                return mfu / ratio

            right = ax.secondary_yaxis("right", functions=(to_mfu, to_tokens))
            right.set_ylabel("MFU (plan's GPUs)")
            right.yaxis.set_major_formatter(PercentFormatter(1.0, decimals=None))
        ax.set_title("Throughput and MFU over time (shaded: recovering)")
        ax.grid(alpha=0.3)
        handles, labels = ax.get_legend_handles_labels()
        if labels:
            ax.legend(handles[:1], labels[:1], loc="lower right")

    return png(draw)


def goodput_breakdown(data: ReportData) -> bytes:
    """Allocated time as a stacked bar by cause, beside the plan's expected goodput."""
    goodput = data.run.get("goodput") or {}
    lost = goodput.get("lost") or {}
    allocated = goodput.get("allocated_s") or 0.0
    parts = {
        "productive": goodput.get("productive_s", 0.0),
        "recomputed steps": lost.get("recomputed_steps_s", 0.0),
        "detection": lost.get("detection_s", 0.0),
        "drain + resubmit": lost.get("drain_and_resubmit_s", 0.0),
        "start-up + load": lost.get("startup_and_load_s", 0.0),
        "checkpoint stalls": lost.get("checkpoint_stalls_s", 0.0),
    }

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        achieved_y, planned_y = 0, 1
        if "goodput" in data.plan:
            planned = float(data.plan["goodput"])
            ax.barh(planned_y, planned, color=LOST_COLOURS["productive"])
            ax.barh(
                planned_y,
                1 - planned,
                left=planned,
                color="#f4b6b6",
                hatch="//",
                label="expected loss (failures)",
            )
            ax.text(planned / 2, planned_y, f"{planned:.0%}", ha="center", va="center")
        left = 0.0
        for name, seconds in parts.items():
            share = seconds / allocated if allocated else 0.0
            if share <= 0:
                continue
            ax.barh(achieved_y, share, left=left, color=LOST_COLOURS[name], label=name)
            if share > 0.06:
                ax.text(left + share / 2, achieved_y, f"{share:.0%}", ha="center", va="center")
            left += share
        ax.set_yticks([achieved_y, planned_y], ["achieved", "planned"])
        ax.xaxis.set_major_formatter(PercentFormatter(1.0))
        ax.set_xlim(0, 1)
        ax.set_xlabel(f"share of the {allocated:.0f} s the run held its nodes")
        ax.set_title("Goodput: where the allocated time went")
        ax.legend(loc="upper center", ncol=4, fontsize=8, bbox_to_anchor=(0.5, -0.4))

    return png(draw, (9, 3.2))


def recovery_timeline(data: ReportData) -> bytes:
    """Each incident's phases as a Gantt bar, in seconds from the failure signal."""

    def draw(fig: Figure) -> None:
        ax = fig.add_subplot()
        colours = plt.get_cmap("tab10")
        for incident in data.incidents:
            t0 = parse_time(incident["signal_at"])
            for k, (label, starts, end_key) in enumerate(PHASES):
                start = next((incident[s] for s in starts if incident.get(s)), None)
                begin, end = parse_time(start), parse_time(incident.get(end_key))
                if t0 is None or begin is None or end is None:
                    continue
                left = (begin - t0).total_seconds()
                ax.barh(
                    f"#{incident['id']} {incident['signal']} on {incident['node_name'] or '-'}",
                    max((end - begin).total_seconds(), 0.05),
                    left=left,
                    color=colours(k),
                    label=label,
                )
        if not data.incidents:
            ax.text(
                0.5,
                0.5,
                data.incidents_note or "no failures: nothing to recover",
                ha="center",
                va="center",
                transform=ax.transAxes,
            )
            ax.set_yticks([])
        ax.set_xlabel("seconds since the failure signal")
        ax.set_title("Recovery timeline")
        handles, labels = ax.get_legend_handles_labels()
        if labels:
            unique = dict(zip(labels, handles, strict=True))
            ax.legend(
                unique.values(),
                unique.keys(),
                loc="upper center",
                ncol=6,
                fontsize=8,
                bbox_to_anchor=(0.5, -0.35),
            )
        ax.grid(axis="x", alpha=0.3)

    return png(draw, (9, max(2.8, 1.6 + 0.6 * len(data.incidents))))
