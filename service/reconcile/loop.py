"""The background reconcile loop: one per database, guarded by a Postgres advisory lock.

The loop drives every configured cluster (service/clusters/registry.py). Each tick reads
each cluster once (outside any transaction), then runs the steps in an order that matters:
recover from failures before restarting anything, keep the spare pool full before placing
runs, place before submitting. A step that talks to Slurm runs once per cluster that
answered, with that cluster's client and snapshot, on that cluster's rows only: a run's
drains, spares, reservations and requeues stay inside its cluster. A step that only reads
and writes the database runs once, over the clusters that answered. A cluster whose read
fails sits the tick out, recorded unreachable since its first failure
(service/clusters/reachability.py); the others tick on. Before each step the leader asks
Postgres whether its session still holds the lock (service/leader.py), so a replica that
lost its database connection, and with it the lock, stops acting before another replica
starts.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from service.clusters import reachability, registry
from service.config import Settings
from service.config_areas.clusters import ClusterConfig
from service.db import get_engine, session_scope
from service.identity.gate import OwnerGate
from service.leader import LeaderLock
from service.models.base import utcnow
from service.nodes.cluster_topology import record_topology
from service.nodes.service import sync_from_slurm
from service.observability.metrics import RECONCILE_DURATION, RECONCILE_LAST_TICK
from service.reconcile import (
    cancellation,
    failover,
    placement,
    polling,
    preemption,
    submission,
    sweeps,
)
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


class NoClusterAnswered(RuntimeError):
    """Every cluster's read failed this tick: nothing can be decided (the tick fails)."""


@dataclass
class ClusterDriver:
    """One cluster as the reconciler drives it: its Slurm client, the topology last read,
    and since when its controller has not answered (None: it answered the last read)."""

    slurm: SlurmClient
    switches: dict[str, str] = field(default_factory=dict)
    switches_read: float = 0.0
    unreachable_since: datetime | None = None
    recorded: bool = False  # the database holds the reachability above

    @property
    def name(self) -> str:
        return self.slurm.cluster_name


@dataclass(frozen=True)
class Step:
    """One reconcile step: `per_cluster` runs for each cluster that answered, with its
    driver and snapshot; `once` runs a single time, given the names of those clusters."""

    name: str
    per_cluster: Callable[[ClusterDriver, ClusterSnapshot], None] | None = None
    once: Callable[[list[str]], None] | None = None


def cli_client(settings: Settings, cluster: ClusterConfig) -> SlurmClient:
    """The real client of `cluster`, acting as a run's owner on that same cluster."""
    return CliSlurmClient(settings, OwnerGate(settings, cluster), cluster)


class Reconciler:
    """Every reconcile step, run in order each tick against each cluster's SlurmClient: the
    real CLI in the service (one per configured cluster), in-memory fakes in unit tests and
    simulations (given as `slurms`, the default cluster first)."""

    def __init__(self, settings: Settings, *slurms: SlurmClient) -> None:
        self.settings = settings
        clients = list(slurms) or [cli_client(settings, c) for c in registry.clusters(settings)]
        self.drivers = [ClusterDriver(client) for client in clients]
        self.classifier = Classifier.from_file(settings.classification_file)
        # Since when this process has seen everything the workers and agents sent: its
        # start, and again each time it leads after losing the lock. Losing the lock means
        # losing Postgres (a restart, a cut connection) or another replica leading; either
        # way heartbeats and reports may have failed meanwhile, so silence is measured
        # from no earlier than this (recovery/health.py, recovery/hangs.py). A connection
        # that keeps dropping postpones those verdicts: the safe side, where counting the
        # outage as silence would drain healthy nodes and restart training runs.
        self.watching_since: datetime = utcnow()

    def driver(self, cluster: str) -> ClusterDriver:
        return next(d for d in self.drivers if d.name == cluster)

    def sync_nodes(self, snapshot: ClusterSnapshot) -> None:
        driver = self.driver(snapshot.cluster)
        topology = None
        if time.monotonic() - driver.switches_read > TOPOLOGY_EVERY_S or not driver.switches:
            # The nodes' groups (leaf switches or blocks) and the kind, which decides whether
            # a model replica must stay inside its group (service/nodes/cluster_topology.py).
            topology = driver.slurm.topology()
            driver.switches, driver.switches_read = topology.group_of, time.monotonic()
        with session_scope() as session:
            sync_from_slurm(
                session, snapshot.cluster, list(snapshot.nodes.values()), driver.switches
            )
            if topology is not None:
                record_topology(session, snapshot.cluster, topology)

    def read_clusters(self) -> list[tuple[ClusterDriver, ClusterSnapshot]]:
        """Each cluster's snapshot, those that answered, in the configured order; each
        cluster's reachability recorded where it changed. NoClusterAnswered when none did."""
        read: list[tuple[ClusterDriver, ClusterSnapshot]] = []
        failures: list[Exception] = []
        for driver in self.drivers:
            try:
                snapshot = take_snapshot(driver.slurm)
            except Exception as exc:  # a silent or failing controller sits the tick out
                failures.append(exc)
                self._unreachable(driver, f"{type(exc).__name__}: {exc}")
                continue
            self._reachable(driver)
            read.append((driver, snapshot))
        if not read:
            raise NoClusterAnswered(
                "no cluster answered: " + "; ".join(f"{type(e).__name__}: {e}" for e in failures)
            ) from (failures[-1] if failures else None)
        return read

    def _unreachable(self, driver: ClusterDriver, detail: str) -> None:
        if driver.unreachable_since is not None and driver.recorded:
            return  # the silence goes on: recorded when it began
        log.warning("cluster %s did not answer; its steps wait: %s", driver.name, detail)
        with session_scope() as session:
            driver.unreachable_since = reachability.record_unreachable(
                session, driver.name, driver.unreachable_since or utcnow(), detail
            )
        driver.recorded = True

    def _reachable(self, driver: ClusterDriver) -> None:
        if driver.unreachable_since is None and driver.recorded:
            return
        if driver.unreachable_since is not None:
            log.info("cluster %s answers again", driver.name)
        with session_scope() as session:
            reachability.record_reachable(session, driver.name)
        driver.unreachable_since, driver.recorded = None, True

    def steps(self) -> list[Step]:
        """The tick's steps in order. The module's functions are looked up at each tick,
        so a bench can wrap them (bench/reconciler_scale.py)."""
        settings = self.settings
        return [
            Step("sync nodes", lambda d, s: self.sync_nodes(s)),
            Step("incidents", lambda d, s: process_incidents(settings, d.slurm)),
            Step("node health", lambda d, s: check_nodes(settings, s, self.watching_since)),
            Step("heartbeat returns", lambda d, s: return_heartbeat_drains(settings, s, d.slurm)),
            Step("hangs", once=lambda names: check_hangs(settings, self.watching_since, names)),
            # Once over every cluster, the silent ones too: a run whose cluster cannot run it
            # moves before placement, which gives it nodes on its new cluster this tick.
            Step("failover", once=lambda names: failover.fail_over_stranded_runs(settings)),
            Step("spares", lambda d, s: maintain_spares(settings, s, d.slurm)),
            Step("placement", lambda d, s: placement.place_pending(settings, s)),
            Step("preemption", lambda d, s: preemption.preempt_for_waiting_runs(s)),
            Step(
                "segments",
                once=lambda names: preemption.stop_segments_at_time_limit(settings, names),
            ),
            Step(
                "stop deadlines",
                lambda d, s: preemption.enforce_stop_deadlines(settings, d.slurm),
            ),
            Step("run reservations", lambda d, s: preemption.sync_run_reservations(s, d.slurm)),
            Step("lighthouses", once=lambda names: lighthouse.maintain_lighthouses(settings)),
            Step("submission", lambda d, s: submission.submit_pending(settings, s, d.slurm)),
            Step(
                "replica groups",
                lambda d, s: submission.submit_group_attempts(settings, s, d.slurm),
            ),
            Step(
                "ended attempts' jobs",
                lambda d, s: ended_jobs.cancel_jobs_of_ended_attempts(d.slurm),
            ),
            Step("sweeps", lambda d, s: sweeps.submit_sweeps(settings, d.slurm)),
            Step("cancellation", lambda d, s: cancellation.stop_cancelling(settings, d.slurm)),
            Step("job states", lambda d, s: polling.poll_attempts(settings, d.slurm)),
            Step("array nodes", lambda d, s: sweeps.hold_array_nodes(s, d.slurm)),
            Step("release", lambda d, s: placement.release_ended_runs(s, d.slurm)),
            Step(
                "leaked reservations",
                lambda d, s: placement.sweep_reservations(settings, s, d.slurm),
            ),
        ]

    def tick(self, still_leader: Callable[[], bool] | None = None) -> None:
        """One pass over everything that may need action on every cluster that answers; it
        stops before the next step as soon as `still_leader()` says this process no longer
        holds the leader lock."""
        read = self.read_clusters()
        names = [driver.name for driver, _ in read]
        for step in self.steps():
            if still_leader is not None and not still_leader():
                log.warning("not the leader any more: tick stopped before step '%s'", step.name)
                return
            if step.once is not None:
                _attempt(step.name, None, step.once, names)
            elif step.per_cluster is not None:
                for driver, snapshot in read:
                    _attempt(step.name, driver.name, step.per_cluster, driver, snapshot)


def _attempt(name: str, cluster: str | None, step: Callable[..., None], *args: object) -> None:
    """Run one step; one failing step (on one cluster) must not stop the others."""
    try:
        step(*args)
    except Exception:
        on = f" on cluster {cluster}" if cluster is not None else ""
        log.exception("reconcile step '%s' failed%s; retrying next tick", name, on)


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
