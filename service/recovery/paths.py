"""Which recovery path a failure takes: the fast path or the classic one.

The fast path (docs/design.md, "Fast recovery") keeps a run of several data-parallel
replica groups training while the group that lost a node is resubmitted onto a spare and
heals from a live peer; it loses at most one optimizer step. It only works while at least
one complete, live copy of the model and optimizer state remains and enough groups keep
stepping. Everything else takes the classic path: stop the run, a fresh sbatch, and a
restore from the last committed disk checkpoint.

Pure: plain values in, a decision out, so the reconciler, the planner's goodput model and
the failure simulation (issue 14) all ask the same question the same way.
"""

from __future__ import annotations

from collections.abc import Collection
from enum import StrEnum


class RecoveryPath(StrEnum):
    """How the service recovers a run from a failure."""

    # Only the failed replica group's job is resubmitted; the others keep stepping.
    FAST = "fast"
    # The whole run stops and restarts from its last committed disk checkpoint.
    CLASSIC = "classic"


class ClassicBecause(StrEnum):
    """Why the fast path cannot handle a failure (stored on the incident)."""

    # The run has a single replica group: there is no peer to keep stepping or to heal from.
    NO_REPLICAS = "no_replicas"
    # Every replica group lost a node at once: no live copy of the state is left to heal
    # from, so the state must come from disk.
    ALL_COPIES_LOST = "all_copies_lost"
    # Some groups survive, but fewer than the run requires to keep stepping (the quorum's
    # minimum size, torchft's min_replica_size).
    TOO_FEW_HEALTHY_GROUPS = "too_few_healthy_groups"
    # The failure is not confined to replica groups: the lighthouse that holds the quorum
    # is gone, so no group can step until it is restarted with the run.
    LIGHTHOUSE_LOST = "lighthouse_lost"
    # The service found a fast recovery it had started but cannot finish it: the surviving
    # groups stopped while it was down (no live peer any more). A fast recovery whose
    # survivors still step is resumed, not demoted: see service/recovery/fast_path.py.
    SURVIVORS_STOPPED_DURING_SERVICE_RESTART = "survivors_stopped_during_service_restart"
    # The groups' copies disagreed (silent data corruption: every group compares with the
    # others and all stop): no copy is trusted to heal from, the run rolls back from disk.
    ROLLBACK = "rollback"


def choose_recovery_path(
    *,
    replica_groups: int,
    failed_groups: Collection[int],
    min_healthy_groups: int = 1,
    lighthouse_alive: bool = True,
    survivors_stepping: bool = True,
) -> tuple[RecoveryPath, ClassicBecause | None]:
    """The path for a failure of `failed_groups` (group ids, 0-based) in a run of
    `replica_groups` groups, and why not the fast one when it is classic.

    `min_healthy_groups` is how many groups must keep stepping for the run to go on (at
    least 1). `lighthouse_alive` is False when the quorum's lighthouse died with the
    failure; `survivors_stepping` is False when the groups outside `failed_groups` have
    stopped too (seen after a service restart).
    """
    if replica_groups < 1:
        raise ValueError(f"replica_groups must be at least 1, got {replica_groups}")
    if min_healthy_groups < 1:
        raise ValueError(f"min_healthy_groups must be at least 1, got {min_healthy_groups}")
    failed = set(failed_groups)
    if not failed:
        raise ValueError("failed_groups is empty: there is no failure to recover from")
    outside = sorted(g for g in failed if not 0 <= g < replica_groups)
    if outside:
        raise ValueError(
            f"failed_groups {outside} are not groups of a run with {replica_groups} groups"
        )
    if replica_groups == 1:
        return RecoveryPath.CLASSIC, ClassicBecause.NO_REPLICAS
    healthy = replica_groups - len(failed)
    if healthy == 0:
        return RecoveryPath.CLASSIC, ClassicBecause.ALL_COPIES_LOST
    if not survivors_stepping:
        return RecoveryPath.CLASSIC, ClassicBecause.SURVIVORS_STOPPED_DURING_SERVICE_RESTART
    if not lighthouse_alive:
        return RecoveryPath.CLASSIC, ClassicBecause.LIGHTHOUSE_LOST
    if healthy < min_healthy_groups:
        return RecoveryPath.CLASSIC, ClassicBecause.TOO_FEW_HEALTHY_GROUPS
    return RecoveryPath.FAST, None
