"""What a goodput is made of: the figures (`Goodput`, its `LostTime` by cause) and the two
measures that both ways of computing them share (service/runs/goodput.py for a run that
trains as one job, service/runs/replica_goodput.py for one of replica groups side by side):
what one checkpoint save cost, and a span in seconds."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from service.models import Checkpoint


class LostTime(BaseModel):
    recomputed_steps_s: float = Field(
        description="Steps trained after the last commit of a "
        "failed attempt, trained again by the next one."
    )
    detection_s: float = Field(description="From the failed attempt's last step to its end.")
    drain_and_resubmit_s: float = Field(description="From an attempt's end to the next start.")
    preempted_s: float = Field(
        default=0.0, description="From yielding to a higher-priority run to starting again."
    )
    segment_boundaries_s: float = Field(
        default=0.0, description="Between time-limited segments: stop, requeue, start."
    )
    startup_and_load_s: float = Field(
        description="From an attempt's start to its first step "
        "(process start, rendezvous, checkpoint load)."
    )
    checkpoint_stalls_s: float = Field(
        description="What checkpoint saves cost training: the time they blocked it plus how "
        "much slower the steps beside each asynchronous save ran (worker/checkpoint_cost.py)."
    )
    rolled_back_s: float = Field(
        default=0.0,
        description="Steps trained after the checkpoint a rollback past a loss spike or "
        "non-finite value resumed from (service/runs/rollback.py): thrown away, not "
        "recomputed (their data is skipped).",
    )
    cluster_failover_s: float = Field(
        default=0.0,
        description="Moves to another cluster after the run's own could not run it "
        "(service/reconcile/failover.py): from the last step on the old cluster to the start "
        "on the new one, and the steps since the last checkpoint, trained again.",
    )
    degraded_s: float = Field(
        default=0.0,
        description="Replica groups: time the run trained with fewer groups while a failed "
        "one was replaced (its share of the GPUs idle), in whole-run seconds.",
    )

    @property
    def total_s(self) -> float:
        """Every cause added up, in one order for both kinds of run (a cause a run cannot
        have is 0.0, which leaves the sum's float as it was)."""
        return (
            self.recomputed_steps_s
            + self.detection_s
            + self.drain_and_resubmit_s
            + self.startup_and_load_s
            + self.checkpoint_stalls_s
            + self.preempted_s
            + self.segment_boundaries_s
            + self.rolled_back_s
            + self.cluster_failover_s
            + self.degraded_s
        )


class Goodput(BaseModel):
    allocated_s: float
    allocated_gpu_hours: float
    productive_s: float
    goodput: float | None = Field(description="productive / allocated (None before the start).")
    lost: LostTime
    queued_s: float = Field(description="Waiting in the Slurm queue before the first start.")


def checkpoint_stall_s(checkpoint: Checkpoint) -> float:
    """What one save cost training, as its worker measured it: blocking time plus the excess
    of the steps that ran beside it. A save reported by a worker from before that
    measurement has only its write time, which is counted whole, as it used to be."""
    if checkpoint.stall_s is not None:
        return checkpoint.stall_s
    return checkpoint.write_s or 0.0


def seconds_between(start: datetime | None, end: datetime | None) -> float:
    """From `start` to `end` in seconds; 0 when either is unknown or they are out of order."""
    return max((end - start).total_seconds(), 0.0) if start and end else 0.0
