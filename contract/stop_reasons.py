"""Why an attempt stopped: asked by the service, or ended on its own.

One value per cause the service acts on or reports. Code branches on these, never on the
human-readable text beside them (an attempt's `end_reason`), so "preempted by run 1" can no
longer be confused with run 12's reason by a prefix match. Where a reason names another run
(a preemption), that run's id travels in its own field, never inside a string.
"""

from __future__ import annotations

from enum import StrEnum


class StopReason(StrEnum):
    """Why an attempt stopped or ended (stored on the attempt; shown by the API)."""

    # Asked by the service: the ranks checkpoint and exit 0 (a yield, not a failure).
    PREEMPTED = "preempted"  # a higher-priority run needed its nodes (see stopped_for_run_id)
    TIME_LIMIT = "time_limit"  # a segment of a run longer than its Slurm time limit
    # Ended.
    COMPLETED = "completed"  # trained every step; the final checkpoint is committed
    CANCELLED = "cancelled"  # the user cancelled the run
    NODE_FAILURE = "node_failure"  # a node was drained; the run moves to a spare or shrinks
    RECOVERY_RESTART = "recovery_restart"  # a hang or a transient error: restarted in place
    JOB_FAILED = "job_failed"  # the job left Slurm without the worker's final step
    DO_NOT_RETRY = "do_not_retry"  # the worker exited with ExitCode.DO_NOT_RETRY
    SUBMISSION_FAILED = "submission_failed"  # sbatch refused the job
    # The checkpoint this attempt resumed from failed its checksums
    # (service/recovery/checkpoints.py): it is marked CORRUPT and the next attempt resumes
    # from the one before. The run did nothing wrong, so it uses up none of max_restarts.
    CHECKPOINT_CORRUPT = "checkpoint_corrupt"
    # The same failure at the same step as the attempt before, which resumed from the same
    # checkpoint: a bug or bad data, not bad luck. Retried once, then the run stops here
    # instead of burning the rest of max_restarts (service/recovery/restart.py).
    DETERMINISTIC_FAILURE = "deterministic_failure"
    # The worker saw a non-finite or spiking loss or gradient norm (worker/anomaly.py): the
    # next attempt resumes from the newest checkpoint before it with a window of data
    # skipped. Not a failure of the run's nodes: it uses up none of max_restarts.
    ROLLED_BACK = "rolled_back"
    # Anomalies at the same place again after SpikeRule.max_rollbacks_at_step rollbacks:
    # skipping data does not help, the run stops for a human instead of looping.
    REPEATED_ANOMALY = "repeated_anomaly"
    # A node of the run was persistently slower than its peers (service/nodes/stragglers.py)
    # and the cluster's policy is `move`: the ranks checkpoint and exit 0 when asked, and
    # the run resumes on a spare. The hardware did not fail, so it is neither a hardware
    # restart nor one of max_restarts.
    SLOW_NODE = "slow_node"
    # Data-parallel replicas' parameters disagreed (worker/sdc.py): the odd node is drained
    # and the run resumes from a checkpoint older than the last clean comparison
    # (service/recovery/sdc.py). Bad hardware, not the run: it uses up none of max_restarts.
    SDC = "sdc"
    # The run's whole cluster could not run it past the site's limit (its controller silent
    # and its ranks too, or too few healthy nodes with the spares spent): the run continues
    # on another cluster from its last trusted checkpoint (service/reconcile/failover.py).
    # The cluster failed, not the run: a hardware restart, none of max_restarts.
    CLUSTER_FAILOVER = "cluster_failover"

    @property
    def is_yield(self) -> bool:
        """A stop the service asked for at a checkpoint: nothing counts against restarts."""
        return self in (StopReason.PREEMPTED, StopReason.TIME_LIMIT, StopReason.SLOW_NODE)
