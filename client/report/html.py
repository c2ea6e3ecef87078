"""The report page: one HTML file with its plots inlined, plus the PNGs beside it.

Inlined (data: URIs) so the page is self-contained: it can be mailed, attached to an
incident ticket or opened from an archive without its folder, and loads nothing from the
network. The PNG files are written too, for slides and tickets.
"""

from __future__ import annotations

import base64
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jinja2

from client.report import plots
from client.report.data import ReportData, parse_time

TEMPLATE = "report.html.j2"
PLOTS = {
    "loss.png": ("Loss against tokens", plots.loss_vs_tokens),
    "throughput.png": ("Throughput and MFU over time", plots.throughput),
    "goodput.png": ("Goodput breakdown", plots.goodput_breakdown),
    "recovery.png": ("Recovery timeline", plots.recovery_timeline),
}


def _fmt(value: Any, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def _mfu(value: float | None) -> str:
    """Three decimals below 0.1 % (CPU ranks against H100 peaks), else one."""
    return _fmt(value, ".3%" if value is not None and value < 1e-3 else ".1%")


def plan_vs_achieved(data: ReportData) -> list[tuple[str, str, str]]:
    """(figure, planned, achieved) rows; '-' where one side has no such figure."""
    plan, run = data.plan, data.run
    goodput = (run.get("goodput") or {}).get("goodput")
    tokens = data.median("tokens_per_s")
    ratio = data.mfu_per_token_per_s
    writes = [c["write_s"] for c in data.checkpoints if c.get("write_s")]
    layout = run["layout"]
    planned_layout = plan.get("layout") or {}

    def shape(lay: dict[str, Any]) -> str:
        keys = ("dp", "tp", "pp", "cp", "zero_stage", "micro_batch_size")
        return " ".join(f"{k}={lay[k]}" for k in keys if k in lay) or "-"

    started = parse_time(run["started_at"])
    ended = parse_time(run["ended_at"]) or datetime.now(UTC)
    elapsed_h = (ended - started).total_seconds() / 3600 if started else None
    failures = sum(1 for a in run["attempts"] if a["state"] == "FAILED")
    return [
        ("parallel layout", shape(planned_layout), shape(layout)),
        (
            "step time",
            _fmt(plan.get("step_time_s"), ".3g") + " s",
            _fmt(data.median("step_time_s"), ".3g") + " s (median)",
        ),
        ("tokens/s", _fmt(plan.get("tokens_per_s"), ",.0f"), _fmt(tokens, ",.0f") + " (median)"),
        (
            "MFU",
            _fmt(plan.get("mfu"), ".1%"),
            _mfu(tokens * ratio if tokens and ratio else None) + " (median)",
        ),
        ("goodput", _fmt(plan.get("goodput"), ".1%"), _fmt(goodput, ".1%")),
        (
            "checkpoint every",
            _fmt((plan.get("checkpoint") or {}).get("interval_steps"), "d") + " steps",
            f"{run['spec']['checkpoint_every']} steps",
        ),
        (
            "checkpoint write",
            _fmt((plan.get("checkpoint") or {}).get("write_s"), ".1f") + " s",
            _fmt(sorted(writes)[len(writes) // 2] if writes else None, ".2f") + " s (median)",
        ),
        (
            "memory per GPU",
            _fmt((plan.get("memory_gib_per_gpu") or {}).get("total"), ".1f") + " GiB",
            "not measured",
        ),
        (
            "interruptions",
            f"one per {_fmt(plan.get('mtbi_h'), '.0f')} h (MTBI)",
            f"{failures} in {_fmt(elapsed_h, '.2f')} h",
        ),
        (
            "hot spares",
            _fmt(plan.get("spare_nodes"), "d"),
            f"{run['num_hardware_restarts']} taken over",
        ),
    ]


def render_report(data: ReportData, out: Path) -> Path:
    """Write the PNGs and report.html into `out`; returns the page's path."""
    out.mkdir(parents=True, exist_ok=True)
    figures = []
    for name, (title, draw) in PLOTS.items():
        image = draw(data)
        (out / name).write_bytes(image)
        figures.append(
            {
                "file": name,
                "title": title,
                "src": "data:image/png;base64," + base64.b64encode(image).decode(),
            }
        )
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(Path(__file__).parent),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )
    page = env.get_template(TEMPLATE).render(
        run=data.run,
        plan=data.plan,
        rows=plan_vs_achieved(data),
        figures=figures,
        incidents=data.incidents,
        incidents_note=data.incidents_note,
        events=data.events[-200:],
        num_events=len(data.events),
    )
    path = out / "report.html"
    path.write_text(page)
    return path
