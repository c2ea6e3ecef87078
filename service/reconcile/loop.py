"""The background reconcile loop: one per database, guarded by a Postgres advisory lock.

Each tick reads the cluster once (outside any transaction), then runs the steps in an order
that matters: recover from failures before restarting anything, keep the spare pool full
before placing runs, place before submitting. Before each step the leader asks Postgres
whether its session still holds the lock (service/leader.py), so a replica that lost
its database connection, and with it the lock, stops acting before another replica starts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import datetime

from service.clusters.registry import default_cluster
from service.config import Settings
from service.db import get_engine, session_scope
from service.identity.gate import OwnerGate
from service.leader import LeaderLock
from service.models.base import utcnow
from service.nodes.cluster_topology import record_topology
from service.nodes.service import sync_from_slurm
from service.observability.metrics import RECONCILE_DURATION, RECONCILE_LAST_TICK
from service.reconcile import cancellation, placement, polling, preemption, submission, sweeps
from service.recovery import ended_jobs, lighthouse
from service.recovery.classification import Classifier
from service.recovery.hangs import check_hangs
from service.recovery.health import check_nodes
from service.recovery.heartbeat_return import return_heartbeat_drains
from service.recovery.incidents import process_incidents
from service.recovery.spares import maintain_spares
from service.slurm.cli import CliSlurmClient
from service.slurm.client import SlurmClient
from service.slurm.snapshot import ClusterSnapshot, take_snapshot

log = logging.getLogger(__name__)

TOPOLOGY_EVERY_S = 30.0


class Reconciler:
    """Every reconcile step, run in order each tick against one SlurmClient: the real CLI
    in the service, an in-memory fake in unit tests and simulations.

    One reconciler drives one cluster, its client's (`slurm.cluster_name`): the nodes, the
    spares and the incidents it acts on are that cluster's. The service drives its
    default cluster; a reconciler per cluster is where failover between them will start."""

    def __init__(self, settings: Settings, slurm: SlurmClient | None = None) -> None:
        self.settings = settings
        if slurm is None:
            cluster = default_cluster(settings)
            slurm = CliSlurmClient(settings, OwnerGate(settings, cluster), cluster)
        self.slurm: SlurmClient = slurm
        self.classifier = Classifier.from_file(settings.classification_file)
        # Since when this process has seen everything the workers and agents sent: its
        # start, and again each time it leads after losing the lock. Losing the lock means
        # losing Postgres (a restart, a cut connection) or another replica leading; either
        # way heartbeats and reports may have failed meanwhile, so silence is measured
        # from no earlier than this (recovery/health.py, recovery/hangs.py). A connection
        # that keeps dropping postpones those verdicts: the safe side, where counting the
        # outage as silence would drain healthy nodes and restart training runs.
        self.watching_since: datetime = utcnow()
        self._switches: dict[str, str] = {}
        self._switches_read = 0.0

    def sync_nodes(self, snapshot: ClusterSnapshot) -> None:
        topology = None
        if time.monotonic() - self._switches_read > TOPOLOGY_EVERY_S or not self._switches:
            # The nodes' groups (leaf switches or blocks) and the kind, which decides whether
            # a model replica must stay inside its group (service/nodes/cluster_topology.py).
            topology = self.slurm.topology()
            self._switches, self._switches_read = topology.group_of, time.monotonic()
        with session_scope() as session:
            sync_from_slurm(
                session, snapshot.cluster, list(snapshot.nodes.values()), self._switches
            )
            if topology is not None:
                record_topology(session, snapshot.cluster, topology)

    def tick(self, still_leader: Callable[[], bool] | None = None) -> None:
        """One pass over everything that may need action; it stops before the next step as
        soon as `still_leader()` says this process no longer holds the leader lock."""
        snapshot = take_snapshot(self.slurm)
        s, settings, slurm = snapshot, self.settings, self.slurm
        steps: list[tuple[str, Callable[[], None]]] = [
            ("sync nodes", lambda: self.sync_nodes(s)),
            ("incidents", lambda: process_incidents(settings, slurm)),
            ("node health", lambda: check_nodes(settings, s, self.watching_since)),
            ("heartbeat returns", lambda: return_heartbeat_drains(settings, s, slurm)),
            ("hangs", lambda: check_hangs(settings, self.watching_since)),
            ("spares", lambda: maintain_spares(settings, s, slurm)),
            ("placement", lambda: placement.place_pending(settings, s)),
            ("preemption", lambda: preemption.preempt_for_waiting_runs(s)),
            ("segments", lambda: preemption.stop_segments_at_time_limit(settings)),
            ("stop deadlines", lambda: preemption.enforce_stop_deadlines(settings, slurm)),
            ("run reservations", lambda: preemption.sync_run_reservations(s, slurm)),
            ("lighthouses", lambda: lighthouse.maintain_lighthouses(settings)),
            ("submission", lambda: submission.submit_pending(settings, s, slurm)),
            ("replica groups", lambda: submission.submit_group_attempts(settings, s, slurm)),
            ("ended attempts' jobs", lambda: ended_jobs.cancel_jobs_of_ended_attempts(slurm)),
            ("sweeps", lambda: sweeps.submit_sweeps(settings, slurm)),
            ("cancellation", lambda: cancellation.stop_cancelling(settings, slurm)),
            ("job states", lambda: polling.poll_attempts(settings, slurm)),
            ("array nodes", lambda: sweeps.hold_array_nodes(s, slurm)),
            ("release", lambda: placement.release_ended_runs(s, slurm)),
            ("leaked reservations", lambda: placement.sweep_reservations(settings, s, slurm)),
        ]
        for name, step in steps:
            if still_leader is not None and not still_leader():
                log.warning("not the leader any more: tick stopped before step '%s'", name)
                return
            try:
                step()
            except Exception:  # one failing step must not stop the others
                log.exception("reconcile step '%s' failed; retrying next tick", name)


def run_forever(
    settings: Settings,
    stop: threading.Event,
    reconciler: Reconciler | None = None,
    lock: LeaderLock | None = None,
) -> None:
    """Lead while this process holds the advisory lock, until `stop` is set.

    Asks for the lock every interval; once it has it, ticks while its session still holds
    it. A lost session (Postgres restarted, the connection cut) ends the leading at the next
    check, and the loop goes back to asking, so at most one process acts at a time.
    """
    lock = lock or LeaderLock(get_engine())
    try:
        while not stop.is_set():
            if not lock.try_acquire():
                stop.wait(settings.reconcile_interval_s)
                continue
            log.info(
                "reconciler holds the lock; reconciling every %.1f s",
                settings.reconcile_interval_s,
            )
            reconciler = reconciler or Reconciler(settings)
            # Blind until now (not leading, or Postgres gone): what was sent meanwhile may
            # not have been recorded, and its senders are retrying.
            reconciler.watching_since = utcnow()
            lead(settings, stop, reconciler, lock)
            if not stop.is_set():
                log.warning("reconciler lost the leader lock; stopped acting, asking for it again")
                stop.wait(settings.reconcile_interval_s)
    finally:
        lock.release()


def lead(
    settings: Settings, stop: threading.Event, reconciler: Reconciler, lock: LeaderLock
) -> None:
    """Tick every interval while the lock is held; return once it is not."""
    while not stop.is_set() and lock.held():
        started = time.monotonic()
        try:
            reconciler.tick(still_leader=lock.held)
        except Exception:  # e.g. Slurm unreachable for the snapshot
            log.exception("reconcile tick failed; retrying next tick")
        RECONCILE_DURATION.observe(time.monotonic() - started)
        RECONCILE_LAST_TICK.set_to_current_time()
        stop.wait(max(0.0, settings.reconcile_interval_s - (time.monotonic() - started)))
