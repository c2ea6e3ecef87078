"""The reconciler against the real, migrated Postgres and an in-memory Slurm.

Every decision runs as in the service: `Reconciler.tick()` opens its own sessions and
commits them. Here those sessions share one connection whose outer transaction is rolled
back after the test (each commit releases a savepoint), so tests leave nothing behind for
the integration tests that use the same database later. Only Slurm is fake
(service/slurm/fake.py); what the workers and agents report goes through the service's own
functions, as their HTTP endpoints call them.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, select
from sqlalchemy.orm import Session, sessionmaker

import service.db
from service.auth.principal import Principal
from service.clusters import registry
from service.config import Settings
from service.config_areas.clusters import ClusterConfig, ClusterReach
from service.db import session_scope
from service.models import Attempt, Incident, Node, Role, Run, RunEvent, UserLink
from service.reconcile import placement, submission
from service.reconcile.loop import Reconciler
from service.recovery import spares
from service.recovery.classification import Classifier
from service.recovery.signals import SignalIn, ingest_node_events
from service.runs import repository
from service.runs.schemas import RunSpec
from service.runs.service import create_run
from service.slurm.fake import DEFAULT_FAKE_CLUSTER, FakeSlurm
from service.slurm.snapshot import take_snapshot
from service.worker_protocol.schemas import (
    CheckpointReport,
    ErrorReport,
    FinishReport,
    ProgressReport,
)
from service.workers import service as workers
from tests.fixtures.rows import checkpoint_path

OTHER = "runyard-dev-b"  # the second cluster of `two`
PREFIX = "runyard-unit"  # the Slurm job prefix; the fake cluster's nodes are unit001, ...
XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."


@pytest.fixture
def db(database_engine: Engine, monkeypatch: pytest.MonkeyPatch) -> Iterator[sessionmaker[Session]]:
    """session_scope() on one connection whose transaction the test never commits."""
    with database_engine.connect() as conn:
        outer = conn.begin()
        factory = sessionmaker(
            bind=conn, join_transaction_mode="create_savepoint", expire_on_commit=False
        )
        monkeypatch.setattr(service.db, "_session_factory", lambda: factory)
        try:
            yield factory
        finally:
            outer.rollback()


# Who the decision tests' runs belong to: a user linked to a Unix user, as every submitter
# must be (service/identity/); the fake Slurm records whom each job runs as.
OWNER = Principal(token_id=0, user="alice", team="vision", role=Role.USER)


def link_owner(session: Session, user: str, unix_user: str) -> None:
    """The user's link, as `runyard admin user link` writes it (no check of the Unix user:
    the fake Slurm runs nothing)."""
    if session.get(UserLink, user) is None:
        session.add(UserLink(user=user, unix_user=unix_user, linked_by="test"))
        session.flush()


class Cluster:
    """A fake Slurm cluster, the reconciler that drives it, and the reports of the workers
    and agents that would run on it."""

    def __init__(self, settings: Settings, slurm: FakeSlurm) -> None:
        self.settings, self.slurm = settings, slurm
        self.reconciler = Reconciler(settings, slurm)

    def tick(self, times: int = 1) -> None:
        for _ in range(times):
            self.reconciler.tick()

    def cycle(self) -> None:
        """A tick, Slurm starting what fits, and a tick that sees it."""
        self.tick()
        self.slurm.schedule()
        self.tick()

    # --- state, read fresh --------------------------------------------------------------

    def run(self, run_id: int) -> Run:
        with session_scope() as session:
            run = repository.get_run(session, run_id)
            assert run is not None
            return run

    def attempts(self, run_id: int) -> list[Attempt]:
        return sorted(self.run(run_id).attempts, key=lambda a: a.number)

    def live_job(self, run_id: int) -> str:
        attempt = repository.live_attempt(self.run(run_id))
        assert attempt is not None and attempt.slurm_job_id is not None
        return attempt.slurm_job_id

    def events(self, run_id: int) -> list[str]:
        with session_scope() as session:
            return list(
                session.scalars(
                    select(RunEvent.kind).where(RunEvent.run_id == run_id).order_by(RunEvent.id)
                )
            )

    def node(self, name: str) -> Node:
        with session_scope() as session:
            node = session.get(Node, (self.slurm.cluster_name, name))
            assert node is not None
            return node

    def incidents(self, node: str) -> list[Incident]:
        with session_scope() as session:
            return list(session.scalars(select(Incident).where(Incident.node_name == node)))

    def crash_after_sbatch(self, run_id: int, *, cut_short: bool = True) -> str:
        """What a service that died right after sbatch leaves: a placed run, its attempt
        SUBMITTING without a job id, and the job queued under the attempt's unique name,
        its submission cut short unless `cut_short` is False (it then fails at start unless
        the adopter finishes it)."""
        self.reconciler.sync_nodes(take_snapshot(self.slurm))
        placement.place_pending(self.settings, take_snapshot(self.slurm))
        with session_scope() as session:
            run = repository.get_run(session, run_id, for_update=True)
            assert run is not None
            request = submission.attempt_request(
                run, submission.new_attempt(session, run, self.settings), self.settings
            )
        assert request.reservation is not None
        self.slurm.create_reservation(request.reservation, request.nodelist.split(","))
        job = self.slurm.submit(request, "token")
        if cut_short:  # died before submitit renamed its pickle
            self.slurm.cut_submission_short([job])
        return job

    # --- what users, admins, agents and workers do --------------------------------------

    def submit_run(self, name: str, **spec: Any) -> int:
        fields: dict[str, Any] = {
            "name": name,
            "model": "tiny",
            "nodes": 2,
            "gpus_per_node": 1,
            "seq_len": 128,
            "global_batch": 8,
            "steps": 100,
            "checkpoint_every": 20,
            "max_restarts": 2,
            **spec,
        }
        with session_scope() as session:
            link_owner(session, OWNER.user, "alice")
            return create_run(session, RunSpec.model_validate(fields), self.settings, OWNER).id

    def set_spares(self, size: int) -> None:
        with session_scope() as session:
            spares.set_target(session, self.slurm.cluster_name, size)

    def xid(self, node: str, code: int = 79) -> None:
        """The node's health agent reports an Xid, as POST /v1/nodes/{node}/events does."""
        event = SignalIn(f"{node}-xid-{code}", "xid", code, XID_79, None, {})
        with session_scope() as session:
            ingest_node_events(
                session, self.slurm.cluster_name, node, [event], self.settings, Classifier()
            )

    def train(self, run_id: int, step: int, *, committed: bool = True) -> None:
        """Rank 0 reports progress up to `step` and a checkpoint there."""
        attempt_id = repository.live_attempt(self.run(run_id)).id  # type: ignore[union-attr]
        with session_scope() as session:
            workers.record_progress(
                session,
                attempt_id,
                ProgressReport(rank=0, metrics=[{"step": step, "loss": 1.0, "step_time_s": 0.1}]),
            )
            state = "COMMITTED" if committed else "WRITING"
            path = checkpoint_path(self.run(run_id), step, self.settings)
            report = CheckpointReport(step=step, path=path, state=state)
            workers.record_checkpoint(session, attempt_id, report, self.settings)

    def finish_training(self, run_id: int) -> None:
        """The worker trains every step, commits the final checkpoint and reports it."""
        total = self.run(run_id).total_steps
        self.train(run_id, total)
        attempt_id = repository.live_attempt(self.run(run_id)).id  # type: ignore[union-attr]
        with session_scope() as session:
            workers.record_finish(session, attempt_id, FinishReport(final_step=total))

    def worker_error(self, run_id: int, kind: str) -> None:
        attempt_id = repository.live_attempt(self.run(run_id)).id  # type: ignore[union-attr]
        with session_scope() as session:
            workers.record_error(session, attempt_id, ErrorReport(rank=0, kind=kind))

    def age_attempt(self, run_id: int, **stamps: datetime) -> None:
        """Move an attempt's timestamps back: what waiting that long would have left."""
        with session_scope() as session:
            run = repository.get_run(session, run_id)
            attempt = repository.live_attempt(run) if run else None
            assert attempt is not None
            for name, value in stamps.items():
                setattr(attempt, name, value)


@pytest.fixture
def settings(tmp_path: Path) -> Settings:
    return Settings(
        state_dir=tmp_path,
        job_prefix=PREFIX,
        accelerator="cpu",
        run_reconciler=False,
    )


@pytest.fixture
def cluster(db: sessionmaker[Session], settings: Settings) -> Cluster:
    """Two leaf switches of three single-GPU nodes: unit001-003 on leaf1, unit004-006 on
    leaf2; no spares until a test asks for them."""
    slurm = FakeSlurm.cluster(num_switches=2, nodes_per_switch=3, num_gpus=1, prefix="unit")
    cluster = Cluster(settings, slurm)
    cluster.set_spares(0)
    return cluster


@pytest.fixture
def two(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> FakeSlurm:
    """The fixture's cluster and a second one of the same shape, both configured and both
    driven by the fixture's reconciler."""
    configs = (
        ClusterConfig(name=DEFAULT_FAKE_CLUSTER, reach=ClusterReach.LOCAL, accelerator="cpu"),
        ClusterConfig(name=OTHER, accelerator="cpu"),
    )
    monkeypatch.setattr(registry, "clusters", lambda settings: configs)
    other = FakeSlurm.cluster(
        num_switches=2, nodes_per_switch=3, num_gpus=1, prefix="unit", cluster_name=OTHER
    )
    cluster.reconciler = Reconciler(cluster.settings, cluster.slurm, other)
    cluster.tick()  # both clusters' nodes synced: placement weighs them
    return other
