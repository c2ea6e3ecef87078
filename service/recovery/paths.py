"""Which recovery path a failure takes: the fast path or the classic one.

The fast path (docs/design.md, "Fast recovery") keeps a run of several data-parallel
replica groups training while the group that lost a node is resubmitted onto a spare and
heals from a live peer; it loses at most one optimizer step. It only works while at least
one complete, live copy of the model and optimizer state remains and enough groups keep
stepping. Everything else takes the classic path: stop the run, a fresh sbatch, and a
restore from the last committed disk checkpoint.

Pure: plain values in, a decision out, so the reconciler, the planner's goodput model and
the failure simulation (issue 14) all ask the same question the same way. The two answers'
types live with the incident that stores them (service/models/incident.py).
"""

from __future__ import annotations

from collections.abc import Collection

from service.models import ClassicBecause, RecoveryPath


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
