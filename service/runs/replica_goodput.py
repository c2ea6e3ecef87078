"""Goodput of a replica-group run: its groups' attempts run side by side, not in turn.

Each group holds 1 / G of the run's GPUs, so each group's lost time counts for 1 / G of the
run's. A group that failed and was replaced by one healing from a live peer (the fast
path: the next attempt of the group has no resume step) leaves the run "degraded" from its
last report to its replacement's first step: the other groups train on (they carry its
share of the batch), the failed group's GPUs do not. A restart of every group from disk
(the classic path) costs what it costs a run without groups: start-up, the gap between the
attempts, the steps recomputed since the checkpoint and the silence before the failure was
seen.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from service.models import Attempt, AttemptState, Checkpoint, Run
from service.models.base import utcnow
from service.runs.goodput_figures import Goodput, LostTime, checkpoint_stall_s, seconds_between


def replica_goodput(
    run: Run, attempts: Sequence[Attempt], checkpoints: Sequence[Checkpoint]
) -> Goodput:
    now = utcnow()
    by_group: dict[int, list[Attempt]] = defaultdict(list)
    for attempt in sorted(attempts, key=lambda a: a.number):
        if attempt.replica_group is not None and attempt.started_at is not None:
            by_group[attempt.replica_group].append(attempt)
    groups = max(1, len(by_group))
    starts = [a.started_at for seq in by_group.values() for a in seq if a.started_at]
    first = min(attempts, key=lambda a: a.number) if attempts else None
    queued = seconds_between(first.submitted_at, min(starts) if starts else now) if first else 0.0
    allocated = seconds_between(min(starts), run.ended_at or now) if starts else 0.0
    committed_at = {c.step: c.committed_at for c in checkpoints if c.committed_at}
    startup = degraded = resubmit = recomputed = detection = 0.0
    for seq in by_group.values():
        for i, attempt in enumerate(seq):
            following = seq[i + 1] if i + 1 < len(seq) else None
            heals = following is not None and following.resume_step is None
            if heals and following is not None:
                degraded += seconds_between(
                    attempt.last_progress_at or attempt.ended_at,
                    following.first_step_at or following.ended_at or now,
                )
                continue
            healed = i > 0 and attempt.resume_step is None  # its start-up is in degraded
            if not healed:
                startup += seconds_between(
                    attempt.started_at, attempt.first_step_at or attempt.ended_at
                )
            if following is None:
                continue
            resubmit += seconds_between(attempt.ended_at, following.started_at)
            if attempt.state == AttemptState.FAILED and following.resume_step is not None:
                commit = committed_at.get(following.resume_step)
                seen = attempt.last_progress_at
                if commit is not None and seen is not None:
                    recomputed += seconds_between(commit, min(seen, attempt.ended_at or seen))
                    detection += seconds_between(seen, attempt.ended_at)
    lost = LostTime(
        recomputed_steps_s=recomputed / groups,
        detection_s=detection / groups,
        drain_and_resubmit_s=resubmit / groups,
        startup_and_load_s=startup / groups,
        checkpoint_stalls_s=sum(map(checkpoint_stall_s, checkpoints)),
        degraded_s=degraded / groups,
    )
    productive = max(allocated - lost.total_s, 0.0)
    return Goodput(
        allocated_s=allocated,
        allocated_gpu_hours=allocated * run.num_nodes * run.gpus_per_node / 3600,
        productive_s=productive,
        goodput=productive / allocated if allocated > 0 else None,
        lost=lost,
        queued_s=queued,
    )
