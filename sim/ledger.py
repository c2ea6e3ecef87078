"""Where every simulated second of the run's allocation went, hour by hour.

The run's allocation is split, at every instant, between productive training and the kinds
of badput. Work trained since the last committed checkpoint is productive only until a
failure forces it to be redone; then it moves to `recompute`, in the hours it was done.
"""

from __future__ import annotations

import math
from enum import StrEnum


class Use(StrEnum):
    PRODUCTIVE = "productive"
    RECOMPUTE = "recompute"  # trained, then lost to a restore from an older checkpoint
    DETECTION = "detection"  # failed, not yet acted on (or survivors' collectives failing)
    RESTART = "restart"  # drain, resubmit, start, NCCL init, checkpoint read
    CHECKPOINT = "checkpoint"  # training blocked by an asynchronous checkpoint save
    DEGRADED = "degraded"  # part of the run recovering or shrunk while the rest trains
    WAITING_SPARE = "waiting_spare"  # nodes missing and no spare to replace them
    CLUSTER_DOWN = "cluster_down"  # the run's cluster cannot run it (sim/outages.py)
    FAILOVER = "failover"  # moving: requeue, start, checkpoint copy and restore elsewhere


BADPUT = [u for u in Use if u != Use.PRODUCTIVE]


class Ledger:
    """Seconds of the whole run's allocation by use, in one-hour buckets."""

    def __init__(self, horizon_s: float) -> None:
        self.horizon_s = horizon_s
        self.hours = math.ceil(horizon_s / 3600)
        self.by_use = {u: [0.0] * self.hours for u in Use}

    def charge(self, use: Use, t0: float, t1: float, weight: float = 1.0) -> None:
        """Add `weight` x the seconds of [t0, t1) to `use`, split over the hours."""
        t0, t1 = max(0.0, t0), min(self.horizon_s, t1)
        if t1 <= t0 or weight == 0:
            return
        bucket = self.by_use[use]
        hour = int(t0 // 3600)
        while t0 < t1:
            end = min(t1, (hour + 1) * 3600)
            bucket[hour] += weight * (end - t0)
            t0, hour = end, hour + 1

    def move(self, src: Use, dst: Use, t0: float, t1: float, weight: float) -> None:
        self.charge(src, t0, t1, -weight)
        self.charge(dst, t0, t1, weight)

    def total(self, use: Use) -> float:
        return sum(self.by_use[use])

    def goodput(self) -> float:
        return self.total(Use.PRODUCTIVE) / self.horizon_s

    def worst_hour(self) -> tuple[int, float]:
        """The hour with the least productive time, and its goodput."""
        hours = [
            (h, self.by_use[Use.PRODUCTIVE][h] / min(3600.0, self.horizon_s - h * 3600))
            for h in range(self.hours)
        ]
        return min(hours, key=lambda x: (x[1], x[0]))

    def badput_shares(self) -> dict[str, float]:
        return {u.value: self.total(u) / self.horizon_s for u in BADPUT}
