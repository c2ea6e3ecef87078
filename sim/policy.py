"""Every decision the simulation takes, each one a call of the service's own function.

Nothing here decides: it adapts the simulation's plain values to the policy functions'
arguments. Each is called through its module (`placement.choose_replacement`, not a name
imported once), so a test that replaces a policy function changes what the simulation does.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from datetime import UTC, datetime, timedelta

from contract import ModelShape
from planner import reliability
from planner.reliability import Reliability
from service.clusters import failover
from service.config import Settings
from service.models import NodeState, RecoveryAction
from service.reconcile import placement as run_placement
from service.recovery import classification, health, paths, signals, spares
from service.slurm import node_choice

DRAINS = RecoveryAction.DRAIN_AND_MOVE


class Policy:
    """The service's decisions for one simulated run, with one classifier and one settings."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.classifier = classification.Classifier()  # the default table, as shipped

    def action(self, signal: str, app_errors: dict[str, int], node: str) -> RecoveryAction:
        """What the service does for this signal from this node: the classification table,
        then the escalation of application-class errors (counted per node in `app_errors`)."""
        rule = self.classifier.classify(signal)
        if rule.action == RecoveryAction.COUNT_AND_ESCALATE:
            app_errors[node] = app_errors.get(node, 0) + 1
        return signals.escalated_action(
            rule.action, app_errors.get(node, 0), self.settings.app_errors_before_drain
        )

    @staticmethod
    def spare_for(
        spares: Sequence[tuple[str, str | None]], run_switches: set[str | None]
    ) -> str | None:
        """The spare that replaces a failed node (a switch the run uses first), or None."""
        return node_choice.choose_replacement(spares, run_switches)

    @staticmethod
    def refill(
        free: Sequence[tuple[str, str | None]], spare_switches: Sequence[str | None], count: int
    ) -> list[str]:
        """Which free healthy nodes join the pool (spread over leaf switches)."""
        return spares.choose_new_spares(free, spare_switches, count)

    @staticmethod
    def pool_target(independent: int, nodes_per_leaf: int, run_nodes: int) -> int:
        """The pool's size: independent failures plus one leaf switch, capped (1.5%)."""
        return spares.pool_target(
            independent=independent, nodes_per_leaf=nodes_per_leaf, run_nodes=run_nodes
        )

    @staticmethod
    def reserve(failures_per_hour: float) -> int:
        """Spares a correlated failure must leave for the independent ones."""
        return spares.reserve_for(failures_per_hour)

    @staticmethod
    def grant(
        missing: dict[int, int], available: int, reserve: int, *, others_train: bool
    ) -> list[int]:
        """Which groups that lack nodes get spares now (whole groups, reserve kept)."""
        return spares.spares_to_grant(missing, available, reserve, others_train=others_train)

    @staticmethod
    def nodes_for_run(
        free: list[tuple[str, str | None]],
        kept_switches: set[str | None],
        need: int,
        spares: list[tuple[str, str | None]] | None = None,
    ) -> list[str] | None:
        """The nodes a run that lacks `need` gets (its own switches first), or None."""
        return run_placement.nodes_for_run(free, kept_switches, need, spares)

    @staticmethod
    def may_shrink(min_nodes: int | None, held: int) -> bool:
        return run_placement.may_shrink(min_nodes, held)

    @staticmethod
    def path(
        replica_groups: int, failed_groups: Collection[int]
    ) -> tuple[paths.RecoveryPath, paths.ClassicBecause | None]:
        return paths.choose_recovery_path(
            replica_groups=replica_groups, failed_groups=failed_groups
        )

    @staticmethod
    def reliability(
        model: ModelShape,
        num_gpus: int,
        step_s: float,
        assumptions: reliability.ReliabilityAssumptions,
    ) -> reliability.Reliability:
        """The checkpoint intervals and the spare pool size, as the planner gives every run."""
        return reliability.assess(model, num_gpus, 8, step_s, assumptions)

    @staticmethod
    def checkpoint_interval_s(rel: Reliability, *, fast_path: bool) -> float:
        """The planner's interval for the path the run recovers on: on the fast path disk
        checkpoints serve only its classic fallbacks (capped at an hour), else Daly's."""
        return rel.interval_s_for(fast_path)

    @staticmethod
    def failover_limit_s(setting_s: float | None, copy_s: float) -> float:
        """How long a run waits for a cluster that cannot run it before it moves."""
        return failover.failover_limit_s(setting_s, copy_s)

    @staticmethod
    def failover_decision(
        home: failover.RunCluster,
        others: Sequence[failover.OtherCluster],
        need_nodes: int,
        hardware: str,
        limit_s: float,
    ) -> failover.FailoverDecision:
        """Stay, wait, or move the run to which cluster (one the planner lays it out on)."""
        return failover.decide(
            home, others, need_nodes=need_nodes, hardware={hardware}, limit_s=limit_s
        )

    @staticmethod
    def move_cost(**phases: float) -> failover.MoveCost:
        """The failover's cost model, phase by phase."""
        return failover.move_cost(**phases)


def heartbeat_detect_s(settings: Settings) -> float:
    """Seconds from a node's last heartbeat to the service's verdict HEARTBEAT_LOST: the
    service's own `health.verdict`, asked at every reconcile tick until it says so."""
    start = datetime(2026, 1, 1, tzinfo=UTC)
    tick = settings.reconcile_interval_s
    for n in range(1, 100_000):
        now = start + timedelta(seconds=n * tick)
        decided = health.verdict(
            NodeState.HEALTHY,
            start,
            ours=True,
            slurm_state=None,
            now=now,
            watching_since=start,
            settings=settings,
        )
        if decided == health.Verdict.HEARTBEAT_LOST:
            return n * tick
    raise ValueError("the heartbeat check never declares a silent node dead")
