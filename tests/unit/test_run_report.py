"""The run report from a known run history: files, figures, and what Chromium shows."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import matplotlib.image
import numpy as np
import pytest

from client.report.data import ReportData
from client.report.html import plan_vs_achieved, render_report
from tests.fixtures.chromium import loaded_images, screenshot

T0 = datetime(2026, 11, 1, 12, 0, tzinfo=UTC)


def at(seconds: float) -> str:
    return (T0 + timedelta(seconds=seconds)).isoformat()


def attempt(n: int, state: str, start: float, end: float | None, resume: int | None) -> dict:
    return {
        "id": 10 + n,
        "number": n,
        "state": state,
        "slurm_job_id": str(100 + n),
        "node_list": None,
        "nodes": ["gpu001", "gpu002" if n == 1 else "gpu005"],
        "resume_step": resume,
        "exit_code": None,
        "end_reason": "node gpu002 failed: xid:79" if state == "FAILED" else None,
        "submitted_at": at(start - 1),
        "started_at": at(start),
        "ended_at": at(end) if end is not None else None,
        "last_heartbeat_at": None,
        "first_step": (resume or 0) + 1,
        "first_step_at": at(start + 3),
    }


def history() -> ReportData:
    """300 steps; gpu002 lost at step 45, attempt 2 resumed from the step-40 checkpoint."""
    plan = {
        "hardware": "h100-sxm",
        "network": "ib",
        "num_gpus": 2,
        "layout": {"dp": 2, "tp": 1, "pp": 1, "cp": 1, "zero_stage": 1, "micro_batch_size": 4},
        "step_time_s": 0.05,
        "tokens_per_s": 20000.0,
        "mfu": 0.4,
        "goodput": 0.97,
        "mtbi_h": 900.0,
        "spare_nodes": 1,
        "checkpoint": {"interval_steps": 50, "write_s": 1.5},
        "memory_gib_per_gpu": {"total": 12.5},
        "mfu_convention": "PaLM",
    }
    attempts = [attempt(1, "FAILED", 0, 30, None), attempt(2, "SUCCEEDED", 40, 80, 40)]
    metrics: list[dict[str, Any]] = []
    for a, steps, start in ((attempts[0], range(1, 46), 3), (attempts[1], range(41, 301), 43)):
        for i, step in enumerate(steps):
            metrics.append(
                {
                    "attempt_id": a["id"],
                    "step": step,
                    "loss": 6.0 * 0.99**step,
                    "tokens_per_s": 9000.0 + 50 * (i % 7),
                    "step_time_s": 0.11,
                    "recorded_at": at(start + i * 0.12),
                }
            )
    run = {
        "id": 7,
        "name": "xid-79",
        "state": "SUCCEEDED",
        "state_reason": "final step 300 committed",
        "num_nodes": 2,
        "gpus_per_node": 1,
        "total_steps": 300,
        "last_step": 300,
        "num_restarts": 1,
        "num_hardware_restarts": 1,
        "started_at": at(0),
        "ended_at": at(80),
        "layout": plan["layout"],
        "spec": {"global_batch": 8, "seq_len": 128, "checkpoint_every": 20},
        "plan": plan,
        "attempts": attempts,
        "goodput": {
            "allocated_s": 80.0,
            "productive_s": 60.0,
            "goodput": 0.75,
            "lost": {
                "recomputed_steps_s": 4.0,
                "detection_s": 2.0,
                "drain_and_resubmit_s": 10.0,
                "startup_and_load_s": 3.0,
                "checkpoint_stalls_s": 1.0,
            },
        },
    }
    incident = {
        "id": 3,
        "signal": "xid:79",
        "node_name": "gpu002",
        "action": "DRAIN_AND_MOVE",
        "state": "RESOLVED",
        "spare_node": "gpu005",
        "resume_step": 40,
        "run_id": 7,
        "attempt_id": 11,
        "message": "gpu002: xid:79 (GPU has fallen off the bus)",
        "recovery_s": 15.0,
        "signal_at": at(29),
        "detected_at": at(29.5),
        "drained_at": at(30),
        "attempt_ended_at": at(30.2),
        "submitted_at": at(39),
        "running_at": at(40),
        "first_step_at": at(44),
    }
    events = [
        {"id": 1, "kind": "run.submitted", "message": "accepted", "created_at": at(-1)},
        {"id": 2, "kind": "recovery.spare_assigned", "message": "gpu005", "created_at": at(30)},
    ]
    checkpoints = [{"step": s, "write_s": 0.4} for s in range(20, 301, 20)]
    return ReportData(run, metrics, events, checkpoints, [incident])


def test_plan_sits_beside_what_was_achieved() -> None:
    rows = {name: (planned, achieved) for name, planned, achieved in plan_vs_achieved(history())}
    assert rows["goodput"] == ("97.0%", "75.0%")
    assert rows["step time"] == ("0.05 s", "0.11 s (median)")
    # MFU scales with tokens/s: 9,150 median tokens/s at 40 % per 20,000 -> 18.3 %.
    assert rows["MFU"][1].startswith("18.")
    assert rows["interruptions"][1].startswith("1 in 0.02 h")
    assert rows["checkpoint every"] == ("50 steps", "20 steps")


@pytest.mark.heavy  # a browser: 5 s, make test-all
def test_report_is_one_page_with_four_plots_that_chromium_loads(tmp_path: Path) -> None:
    page = render_report(history(), tmp_path)

    assert {p.name for p in tmp_path.glob("*.png")} == {
        "loss.png",
        "throughput.png",
        "goodput.png",
        "recovery.png",
    }
    html = page.read_text()
    assert html.count('src="data:image/png;base64,') == 4  # self-contained: no file links
    assert "http://" not in html and "https://" not in html
    assert "xid:79" in html and "gpu005" in html

    images = loaded_images(page)
    assert len(images) == 4
    assert all(i.complete and i.width >= 800 and i.height >= 200 for i in images), images

    shot = screenshot(page, tmp_path / "screenshot.png")
    pixels = matplotlib.image.imread(shot)
    # Not a blank page: a good share of pixels differ from the white background.
    assert np.mean(pixels[..., :3].mean(axis=2) < 0.95) > 0.05
