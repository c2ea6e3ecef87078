"""A running run's checkpoint interval follows the failures the cluster has: failures
injected on the cluster's other nodes raise the observed rate and the interval shortens,
with an event on the run's timeline holding the figures; once they leave the window it
returns; a pinned interval never moves. The real, migrated Postgres, the service's own
functions, the fake Slurm."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import select, update
from sqlalchemy.orm import Session, sessionmaker

from service.config import Settings
from service.db import session_scope
from service.models import Incident, RunEvent
from service.models.base import utcnow
from service.runs import live_interval, plan_outcomes
from service.runs.schemas import RunSpec
from service.runs.service import create_run
from service.slurm.fake import FakeSlurm
from service.worker_protocol.schemas import CheckpointReport, ProgressReport
from service.workers import endpoints
from service.workers import service as workers_service
from tests.fixtures.rows import checkpoint_path
from tests.unit.reconcile.conftest import OWNER, PREFIX, Cluster, link_owner
from tests.unit.reconcile.test_checkpoint_trust import live_attempt_id

STEP_S, STALL_S = 1.0, 10.0  # what the run's workers measure


@pytest.fixture
def cluster(db: sessionmaker[Session], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cluster:
    """The reconciler tests' fake cluster with a one-hour failure window, measuring again
    at every report (no 15 s wait between measurements)."""
    monkeypatch.setattr(plan_outcomes, "REFRESH_S", 0.0)
    settings = Settings(state_dir=tmp_path, job_prefix=PREFIX, accelerator="cpu",
                        run_reconciler=False, live_checkpoint_window_h=1.0)  # fmt: skip
    slurm = FakeSlurm.cluster(num_switches=2, nodes_per_switch=3, num_gpus=1, prefix="unit")
    made = Cluster(settings, slurm)
    made.set_spares(0)
    # The progress endpoint reads the service's settings, as in production.
    monkeypatch.setattr(workers_service, "get_settings", lambda: settings)
    return made


def started(cluster: Cluster, name: str, **spec: Any) -> int:
    fields = {"name": name, "model": "tiny", "nodes": 2, "gpus_per_node": 1, "seq_len": 128,
              "global_batch": 8, "steps": 1_000_000, **spec}  # fmt: skip
    with session_scope() as session:
        link_owner(session, OWNER.user, "alice")
        run_id = create_run(session, RunSpec.model_validate(fields), cluster.settings, OWNER).id
    cluster.cycle()
    return run_id


def report(cluster: Cluster, run_id: int, first_step: int) -> int | None:
    """Rank 0 reports ten steps of STEP_S and a save that stalled STALL_S; the interval the
    service's reply tells the ranks (the progress endpoint's own answer)."""
    rows = [
        {"step": s, "loss": 1.0, "step_time_s": STEP_S} for s in range(first_step, first_step + 10)
    ]
    attempt_id = live_attempt_id(cluster, run_id)
    # Inside the run's folder by the settings the endpoint reads (patched to these above).
    path = checkpoint_path(cluster.run(run_id), first_step, cluster.settings)
    with session_scope() as session:
        # The save first, so that every answer rests on the run's measured stall (before
        # any, the plan's predicted one).
        checkpoint = CheckpointReport(step=first_step, path=path,
                                      state="COMMITTED", write_s=30.0, stall_s=STALL_S)  # fmt: skip
        endpoints.report_checkpoint(attempt_id, checkpoint, session)
        ack = endpoints.report_progress(attempt_id, ProgressReport(rank=0, metrics=rows), session)
    return ack.checkpoint_every


def interval_events(run_id: int) -> list[dict[str, Any]]:
    with session_scope() as session:
        return list(
            session.scalars(
                select(RunEvent.data)
                .where(RunEvent.run_id == run_id, RunEvent.kind == "checkpoint.interval")
                .order_by(RunEvent.id)
            )
        )


def test_failures_shorten_the_interval_and_their_end_lengthens_it_again(cluster: Cluster) -> None:
    run_id = started(cluster, "live")
    pinned = started(cluster, "pinned", checkpoint_every=500)
    # No failure seen yet: Daly's interval at the published rate for this run's save stall.
    quiet = report(cluster, run_id, 1)
    assert quiet is not None and quiet > 1000
    assert report(cluster, pinned, 1) is None  # the user's interval is kept
    # Failures on the cluster's two idle nodes (the runs hold the other four).
    busy = set(cluster.run(run_id).nodes) | set(cluster.run(pinned).nodes)
    idle = [n for n in (f"unit{i:03d}" for i in range(1, 7)) if n not in busy]
    for node in idle:
        cluster.xid(node)
    failing = report(cluster, run_id, 11)
    assert failing is not None and failing < quiet / 1.5  # sqrt(3 / 1) fewer steps
    events = interval_events(run_id)
    assert [(e["from_steps"], e["to_steps"]) for e in events[-1:]] == [(quiet, failing)]
    figures = events[-1]
    assert figures["failures"] == len(idle) and figures["by_cause"] == {"xid:79": len(idle)}
    assert figures["stall_s"] == STALL_S and figures["step_s"] == STEP_S
    assert figures["window_h"] == 1.0 and figures["failures_per_node_hour"] > 0
    # The failures leave the one-hour window: the interval returns.
    with session_scope() as session:
        session.execute(update(Incident).values(created_at=utcnow() - timedelta(hours=2)))
    assert report(cluster, run_id, 21) == quiet
    assert interval_events(run_id)[-1]["to_steps"] == quiet
    assert report(cluster, pinned, 11) is None and interval_events(pinned) == []
    # A new attempt of the live run starts with its current interval, not the spec's.
    assert live_interval.current_every(cluster.run(run_id).config, 100) == quiet
