"""Failover between clusters: whether a run leaves its cluster, for which one, at what cost.

A run's cluster cannot run it when its controller has not answered, or when its healthy
nodes with the spares left are fewer than the run needs. Either can end on its own (a
controller restarts, a rack is powered back), and a move costs a checkpoint copy and a
start on the other cluster, so the run waits for the site's limit first: waiting is renting,
moving is buying, and the limit is the price of the move (the ski-rental rule: rent until
the rent paid equals the price, then buy; it never pays more than twice the best choice made
in hindsight; Karlin, Manasse, Rudolph and Sleator, "Competitive snoopy caching",
Algorithmica 3, 1988). A run whose ranks still report steps stays however long its
controller is silent: Slurm's jobs outlive their slurmctld, and a second copy would train
the same steps twice.

The move's cost (`MoveCost`) counts the wait, the requeue and start on the other cluster,
the copy of the last trusted checkpoint where the other cluster does not mount the
filesystem that holds it, the restore, and the work trained since that checkpoint. The
copy is the only part a restart at home would not pay too, so it is the move's price.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from enum import StrEnum

# slurm.conf(5), SlurmctldTimeout: a backup slurmctld takes over after its primary has been
# silent this long (120 s, Slurm's default). The service never moves a run sooner, so a
# site's own controller failover always gets its chance first.
SLURMCTLD_TIMEOUT_S = 120.0


class FailoverAction(StrEnum):
    STAY = "stay"  # the cluster can run the run
    WAIT = "wait"  # it cannot, but the run waits for it
    FAIL_OVER = "fail_over"  # the run continues on another cluster from its checkpoint


class FailoverReason(StrEnum):
    CAN_RUN = "can_run"  # the controller answers and the nodes suffice
    STILL_STEPPING = "still_stepping"  # the controller is silent, the ranks still report
    WITHIN_LIMIT = "within_limit"  # it cannot run the run, for less than the site's limit
    NO_CLUSTER_FITS = "no_cluster_fits"  # past the limit, and no other cluster can take it
    CONTROLLER_UNREACHABLE = "controller_unreachable"  # silent past the limit: move
    TOO_FEW_HEALTHY_NODES = "too_few_healthy_nodes"  # short, spares exhausted, past it: move


@dataclass(frozen=True)
class RunCluster:
    """The cluster a run is on, as the reconciler last saw it."""

    name: str
    unreachable_for_s: float | None  # seconds its controller has not answered; None: it does
    healthy_nodes: int  # the run's healthy nodes plus the cluster's free healthy ones
    spare_nodes: int  # hot spares left in the pool
    short_for_s: float  # seconds healthy_nodes + spare_nodes has been below the need; 0: not
    run_stepping: bool  # the run's ranks still report steps to the service


@dataclass(frozen=True)
class OtherCluster:
    """A cluster the run might move to."""

    name: str
    hardware: str  # its GPU type (a hardware preset's name)
    reachable: bool  # its controller answers
    free_nodes: int  # healthy nodes in no run and no spare pool
    mounts_checkpoint: bool  # it mounts the filesystem that holds the run's checkpoint


@dataclass(frozen=True)
class FailoverDecision:
    action: FailoverAction
    reason: FailoverReason
    target: str | None = None  # the cluster to move to, when the action is FAIL_OVER


@dataclass(frozen=True)
class MoveCost:
    """Seconds of the whole run's allocation a failover costs, phase by phase."""

    detection_s: float  # the cluster could not run the run until the service moved it
    requeue_start_s: float  # sbatch on the other cluster, Slurm starts it, ranks and NCCL up
    checkpoint_copy_s: float  # 0 where the other cluster mounts the checkpoint's filesystem
    restore_s: float  # the ranks read the checkpoint
    lost_work_s: float  # trained since the last trusted checkpoint, trained again

    @property
    def total_s(self) -> float:
        return (
            self.detection_s
            + self.requeue_start_s
            + self.checkpoint_copy_s
            + self.restore_s
            + self.lost_work_s
        )


def checkpoint_copy_s(
    checkpoint_bytes: float, copy_bytes_per_s: float, *, mounts_checkpoint: bool
) -> float:
    """The copy of the last trusted checkpoint to a cluster that does not mount it; the
    slowest of the link and the two filesystems sets `copy_bytes_per_s`."""
    if mounts_checkpoint:
        return 0.0
    if copy_bytes_per_s <= 0:
        raise ValueError(f"copy_bytes_per_s must be positive, got {copy_bytes_per_s}")
    return checkpoint_bytes / copy_bytes_per_s


def failover_limit_s(setting_s: float | None, copy_s: float) -> float:
    """How long a run waits for its cluster before it moves: the site's `failover_after_s`
    where it sets one; else the move's price, the checkpoint copy (the ski-rental rule in
    the module's docstring), never under Slurm's own controller takeover time."""
    if setting_s is not None:
        return setting_s
    return max(SLURMCTLD_TIMEOUT_S, copy_s)


def move_cost(
    *,
    waited_s: float,
    resubmit_s: float,
    queue_start_s: float,
    start_and_init_s: float,
    restore_s: float,
    copy_s: float,
    lost_work_s: float,
) -> MoveCost:
    """The cost of a move decided after `waited_s`; the start's phases are the ones a
    restart at home pays (sim/costs.py gives each its measured or published figure)."""
    return MoveCost(
        detection_s=waited_s,
        requeue_start_s=resubmit_s + queue_start_s + start_and_init_s,
        checkpoint_copy_s=copy_s,
        restore_s=restore_s,
        lost_work_s=lost_work_s,
    )


def fits(
    other: OtherCluster,
    *,
    need_nodes: int,
    hardware: Collection[str],
    checkpoint_readable: bool = True,
) -> bool:
    """The other cluster can take the whole run now: it answers, has the nodes free, its
    hardware is one the planner has a layout for (resharded where it differs), and it can
    read the checkpoint: it mounts its filesystem, or the checkpoint can be read to copy."""
    return (
        other.reachable
        and other.free_nodes >= need_nodes
        and other.hardware in hardware
        and (other.mounts_checkpoint or checkpoint_readable)
    )


def cheapest(fitting: Sequence[OtherCluster]) -> OtherCluster | None:
    """The cheapest of the clusters that fit (`fits`): one that mounts the checkpoint (the
    copy is the only part of the cost that differs between targets), then the most free
    nodes (room for the run's spares), then the name, so that the choice is the same on
    every tick."""
    if not fitting:
        return None
    return min(fitting, key=lambda o: (not o.mounts_checkpoint, -o.free_nodes, o.name))


def why_it_cannot_run(
    *, unreachable: bool, usable_nodes: int, need_nodes: int
) -> FailoverReason | None:
    """Why a cluster cannot run a run of `need_nodes` now (None: it can): its controller is
    silent, or its healthy and spare nodes are fewer than the run needs. The one statement
    of the two conditions, for `decide` and for the reconciler's list of stranded runs."""
    if unreachable:
        return FailoverReason.CONTROLLER_UNREACHABLE
    if usable_nodes < need_nodes:
        return FailoverReason.TOO_FEW_HEALTHY_NODES
    return None


def decide(
    home: RunCluster,
    others: Sequence[OtherCluster],
    *,
    need_nodes: int,
    hardware: Collection[str],
    limit_s: float,
    checkpoint_readable: bool = True,
    choose: Callable[[Sequence[OtherCluster]], OtherCluster | None] | None = None,
) -> FailoverDecision:
    """Stay, wait or move for a run of `need_nodes` nodes on `home`, which the service
    waits for `limit_s` (`failover_limit_s`) before it moves the run elsewhere.
    `checkpoint_readable` is False when the storage that holds the run's last trusted
    checkpoint cannot be read now (or copies are not made): only a cluster that mounts it
    may then take the run. `choose` picks among the clusters that fit (`fits`); the
    service passes placement's own rule (reconcile/failover.py), which plans the run on
    each; None: `cheapest`."""
    if need_nodes < 1:
        raise ValueError(f"need_nodes must be at least 1, got {need_nodes}")
    why = why_it_cannot_run(
        unreachable=home.unreachable_for_s is not None,
        usable_nodes=home.healthy_nodes + home.spare_nodes,
        need_nodes=need_nodes,
    )
    if why is None:
        return FailoverDecision(FailoverAction.STAY, FailoverReason.CAN_RUN)
    if home.unreachable_for_s is not None:
        if home.run_stepping:
            return FailoverDecision(FailoverAction.STAY, FailoverReason.STILL_STEPPING)
        waited_s = home.unreachable_for_s
    else:
        waited_s = home.short_for_s
    if waited_s < limit_s:
        return FailoverDecision(FailoverAction.WAIT, FailoverReason.WITHIN_LIMIT)
    fitting = [
        o
        for o in others
        if o.name != home.name
        and fits(
            o, need_nodes=need_nodes, hardware=hardware, checkpoint_readable=checkpoint_readable
        )
    ]
    target = (choose or cheapest)(fitting) if fitting else None
    if target is None:
        return FailoverDecision(FailoverAction.WAIT, FailoverReason.NO_CLUSTER_FITS)
    return FailoverDecision(FailoverAction.FAIL_OVER, why, target.name)
