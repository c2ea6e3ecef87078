"""`runyard run report`: a self-contained HTML report of one run, with matplotlib plots."""

from __future__ import annotations

from pathlib import Path

from client.api import RunyardClient
from client.report.data import fetch
from client.report.html import render_report


def write_report(client: RunyardClient, run_id: int, out: Path) -> Path:
    """Fetch the run through the API and write `out/report.html` plus its PNGs."""
    return render_report(fetch(client, run_id), out)
