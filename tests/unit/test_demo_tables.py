"""`make demo`'s tables read in an 80-column terminal: no header or figure is cut ("…")."""

from __future__ import annotations

import pytest
from rich.console import Console

from client import output
from client.devcluster.demo import print_attempts, print_goodput


def goodput(allocated_s: float, lost_s: float) -> dict[str, object]:
    lost = {
        "recomputed_steps_s": lost_s,
        "detection_s": 1.5,
        "drain_and_resubmit_s": 2.25,
        "startup_and_load_s": 12.0,
        "checkpoint_stalls_s": 0.75,
        "degraded_s": 3.0,
    }
    productive = allocated_s - sum(lost.values())
    return {
        "allocated_s": allocated_s,
        "productive_s": productive,
        "goodput": productive / allocated_s,
        "lost": lost,
    }


def attempt(number: int, group: int | None, stop: str | None) -> dict[str, object]:
    return {
        "number": number,
        "replica_group": group,
        "state": "FAILED" if stop == "node_failure" else "SUCCEEDED",
        "slurm_job_id": str(1000 + number),
        "node_list": "gpu[003-004]",
        "resume_step": None,
        "stop_reason": stop,
    }


@pytest.fixture
def narrow(monkeypatch: pytest.MonkeyPatch) -> Console:
    console = Console(width=80, record=True, force_terminal=False)
    monkeypatch.setattr(output, "console", console)
    return console


def test_the_goodput_of_both_recoveries_side_by_side_fits_80_columns(narrow: Console) -> None:
    print_goodput(
        {"classic": {"goodput": goodput(1234.5, 40.0)}, "fast": {"goodput": goodput(987.6, 0.0)}}
    )
    text = narrow.export_text()
    assert "…" not in text and max(map(len, text.splitlines())) <= 80
    assert "CLASSIC" in text and "FAST" in text and "lost: degraded (s)" in text


def test_the_attempts_table_fits_80_columns(narrow: Console) -> None:
    run = {
        "id": 7,
        "attempts": [attempt(1, 0, "completed"), attempt(2, 1, "node_failure"),
                     attempt(3, 1, "completed")],
    }  # fmt: skip
    print_attempts(run)
    text = narrow.export_text()
    assert "…" not in text and "node_failure" in text and "heal" in text
