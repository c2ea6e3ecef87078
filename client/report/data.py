"""Everything a run report shows, fetched once through the API client."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from client.api import ApiError, RunyardClient

METRICS_PAGE = 10_000  # the API's largest page


@dataclass
class ReportData:
    run: dict[str, Any]
    metrics: list[dict[str, Any]]
    events: list[dict[str, Any]]
    checkpoints: list[dict[str, Any]]
    incidents: list[dict[str, Any]]
    incidents_note: str = ""  # why incidents are missing, when they are

    @property
    def plan(self) -> dict[str, Any]:
        return self.run.get("plan") or {}

    @property
    def tokens_per_step(self) -> int:
        spec = self.run["spec"]
        return int(spec["global_batch"]) * int(spec["seq_len"])

    @property
    def mfu_per_token_per_s(self) -> float | None:
        """MFU is proportional to tokens/s for a fixed model and cluster (see the service's
        `achieved_mfu`): the plan's own ratio converts one into the other."""
        plan = self.plan
        if not plan.get("tokens_per_s"):
            return None
        return float(plan["mfu"]) / float(plan["tokens_per_s"])

    def median(self, key: str) -> float | None:
        values = [m[key] for m in self.metrics if m.get(key)]
        return statistics.median(values) if values else None

    def attempt_by_id(self) -> dict[int, dict[str, Any]]:
        return {a["id"]: a for a in self.run["attempts"]}


def parse_time(value: str | None) -> datetime | None:
    return datetime.fromisoformat(value) if value else None


def all_metrics(client: RunyardClient, run_id: int) -> list[dict[str, Any]]:
    """Every reported step across attempts (a recomputed step appears once per attempt)."""
    rows: list[dict[str, Any]] = []
    after = -1
    while True:
        page = client.run_metrics(run_id, after_step=after, limit=METRICS_PAGE)
        if len(page) < METRICS_PAGE:
            return rows + page
        # A full page may end between two attempts' rows of one step: drop that step and
        # ask again from just before it, so no row is skipped.
        last = page[-1]["step"]
        keep = [m for m in page if m["step"] < last]
        if not keep:  # more rows of one step than a page: take them as they are
            keep = page
        rows += keep
        after = keep[-1]["step"]


def all_events(client: RunyardClient, run_id: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    while True:
        page = client.run_events(run_id, after_id=rows[-1]["id"] if rows else 0, limit=1000)
        rows += page
        if len(page) < 1000:
            return rows


def fetch(client: RunyardClient, run_id: int) -> ReportData:
    run = client.get_run(run_id)
    incidents: list[dict[str, Any]] = []
    note = ""
    try:
        incidents = [i for i in client.list_incidents(limit=1000) if i["run_id"] == run_id]
    except ApiError as exc:
        if exc.status not in (401, 403):
            raise
        # Incidents are an admin view; the report is still useful without them.
        note = "The recovery timeline needs an admin token (incidents are admin-only)."
    return ReportData(
        run=run,
        metrics=all_metrics(client, run_id),
        events=all_events(client, run_id),
        checkpoints=client.run_checkpoints(run_id),
        incidents=sorted(incidents, key=lambda i: i["id"]),
        incidents_note=note,
    )
