"""`runyard run watch`: what the view shows, and the exit code for each way a run ends."""

from __future__ import annotations

import io
import re
from typing import Any

import pytest
from rich.console import Console
from sqlalchemy.orm import Session

from client.api import RunyardClient
from client.live.feed import RunSnapshot
from client.live.view import event_style, render
from client.live.watch import watch_run
from client.output import Exit
from service.models import AttemptState, RunState
from tests.fixtures.rows import add_attempt, add_run


def run_dict(**overrides: Any) -> dict[str, Any]:
    run = {
        "id": 7,
        "name": "xid-79",
        "state": "RUNNING",
        "state_reason": "attempt 2 running",
        "total_steps": 300,
        "last_step": 150,
        "last_loss": 2.3456,
        "tokens_per_s": 9000.0,
        "mfu": 0.18,
        "num_restarts": 1,
        "max_restarts": 2,
        "num_hardware_restarts": 1,
        "plan": {"mfu": 0.4, "goodput": 0.97},
        "goodput": {"goodput": 0.81},
        "attempts": [
            {
                "number": 2,
                "state": "RUNNING",
                "slurm_job_id": "102",
                "nodes": ["gpu001", "gpu005"],
                "resume_step": 40,
            }
        ],
    }
    return {**run, **overrides}


def shown(snapshot: RunSnapshot) -> str:
    console = Console(record=True, width=120, file=io.StringIO())
    console.print(render(snapshot, width=120))
    return console.export_text()


def test_view_shows_progress_eta_figures_attempt_and_events() -> None:
    events = [
        {
            "kind": "recovery.spare_assigned",
            "message": "gpu002 drained (xid:79); spare gpu005",
            "created_at": "2026-11-01T12:00:30+00:00",
        },
        {
            "kind": "checkpoint.committed",
            "message": "checkpoint at step 140 committed",
            "created_at": "2026-11-01T12:00:59+00:00",
        },
    ]
    text = shown(RunSnapshot(run_dict(), events, [0.1] * 10))
    assert "step 150/300  50%  ETA 0:00:15" in text  # 150 steps left at 0.1 s each
    assert "━" in text  # the bar itself
    assert "loss 2.3456" in text and "tok/s 9,000" in text
    assert "MFU 18.0% (plan 40.0%)" in text and "goodput 81.0% (plan 97.0%)" in text
    assert "attempt 2 RUNNING" in text and "gpu001, gpu005" in text
    assert "resumed at step 40" in text and "restarts 1/2 (1 hardware)" in text
    assert "12:00:30  recovery.spare_assigned" in text and "xid:79" in text


def test_ended_run_has_no_eta_and_failures_are_red() -> None:
    text = shown(RunSnapshot(run_dict(state="SUCCEEDED", last_step=300), [], [0.1]))
    assert "step 300/300  100%  ETA -" in text
    assert event_style("run.failed") == "red" and event_style("attempt.failed") == "red"
    assert event_style("worker.error") == "red" and event_style("recovery.no_spare") == "red"
    assert event_style("recovery.spare_assigned") == "yellow"
    assert event_style("checkpoint.committed") == "green"


@pytest.mark.parametrize(
    ("state", "code"),
    [
        (RunState.SUCCEEDED, Exit.OK),
        (RunState.FAILED, Exit.ERROR),
        (RunState.CANCELLED, Exit.RUN_CANCELLED),
        (RunState.RUNNING, Exit.STILL_RUNNING),
    ],
)
@pytest.mark.parametrize("terminal", [True, False])
def test_exit_code_says_how_the_run_ended(
    api: Any, db_session: Session, state: RunState, code: int, terminal: bool
) -> None:
    run = add_run(db_session, state, last_step=20, total_steps=100)
    add_attempt(db_session, run, 1, AttemptState.RUNNING)
    client = RunyardClient("http://localhost")  # the app in-process below; loopback: a token may go
    client._http = api  # the real app in-process
    out = io.StringIO()
    console = Console(file=out, force_terminal=terminal, width=100)
    assert watch_run(client, run.id, console, interval_s=0.05, timeout_s=0.3) == code
    assert f"run {run.id}" in out.getvalue()
    assert re.search(r"step\s+20/100", out.getvalue())
