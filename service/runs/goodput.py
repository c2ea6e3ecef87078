"""Goodput: how much of the time a run held its GPUs went into steps that count.

Allocated time runs from the first attempt starting to the run's end (or now): between
attempts the run keeps its nodes in its reservation, so that time is paid for too. Lost time
is split by cause; productive = allocated - lost; goodput = productive / allocated (the same
ratio in GPU-hours). Queueing before the first start is reported but not allocated.

Everything is read from the attempts' stored progress summaries (first and last report
times, kept current by every progress report) and the checkpoints, never from the metric
rows: a long run has millions of those, and `run watch` asks for goodput every 2 s.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from contract import StopReason
from service.models import Attempt, AttemptState, Checkpoint, Run
from service.models.base import utcnow
from service.runs.goodput_figures import Goodput, LostTime, checkpoint_stall_s, seconds_between
from service.runs.replica_goodput import replica_goodput


def compute_goodput(
    run: Run, attempts: Sequence[Attempt], checkpoints: Sequence[Checkpoint]
) -> Goodput:
    """Goodput of `run` from its attempts (in order) and its checkpoints alone."""
    if any(a.replica_group is not None for a in attempts):  # groups run side by side
        return replica_goodput(run, attempts, checkpoints)
    now = utcnow()
    started = [a for a in attempts if a.started_at is not None]
    gpus = run.num_nodes * run.gpus_per_node
    first = attempts[0] if attempts else None
    queued = seconds_between(first.submitted_at, first.started_at or now) if first else 0.0
    if not started:
        return _not_started(queued)
    allocated = seconds_between(started[0].started_at, run.ended_at or now)
    lost = _lost_time(started, checkpoints)
    productive = max(allocated - lost.total_s, 0.0)
    return Goodput(
        allocated_s=allocated,
        allocated_gpu_hours=allocated * gpus / 3600,
        productive_s=productive,
        goodput=productive / allocated if allocated > 0 else None,
        lost=lost,
        queued_s=queued,
    )


def _not_started(queued_s: float) -> Goodput:
    """A run none of whose attempts started yet holds no GPUs: nothing is allocated or lost,
    its goodput is unknown (None, not 0) and only its time in the queue counts."""
    zero = LostTime(
        recomputed_steps_s=0,
        detection_s=0,
        drain_and_resubmit_s=0,
        startup_and_load_s=0,
        checkpoint_stalls_s=0,
    )
    return Goodput(
        allocated_s=0,
        allocated_gpu_hours=0,
        productive_s=0,
        goodput=None,
        lost=zero,
        queued_s=queued_s,
    )


def _lost_time(started: Sequence[Attempt], checkpoints: Sequence[Checkpoint]) -> LostTime:
    """The allocated time that trained no step that counts, by cause, attempt by attempt
    (`started`, in order): each one's start-up, the gap before the next one (charged to why
    this one stopped: a failure or a move, a preemption, a segment's time limit), what a
    failure threw away (`_work_lost`), and what the checkpoint saves cost. A move to another
    cluster is charged whole (its gap, silence and work trained again) to its own cause."""
    committed_at = {c.step: c.committed_at for c in checkpoints if c.committed_at}
    recomputed = detection = resubmit = startup = preempted = segments = rolled_back = 0.0
    failover = 0.0
    for i, attempt in enumerate(started):
        moved = attempt.stop_reason == StopReason.CLUSTER_FAILOVER
        reported = attempt.last_progress_at is not None
        startup += seconds_between(
            attempt.started_at,
            attempt.first_step_at or (attempt.ended_at if not reported else None),
        )
        following = started[i + 1] if i + 1 < len(started) else None
        if following is not None:
            gap = seconds_between(attempt.ended_at, following.started_at)
            if moved:
                failover += gap
            elif attempt.state != AttemptState.STOPPED:
                resubmit += gap
            elif attempt.stop_reason == StopReason.PREEMPTED:
                preempted += gap
            elif attempt.stop_reason == StopReason.SLOW_NODE:  # a move, as after a drain
                resubmit += gap
            else:  # StopReason.TIME_LIMIT
                segments += gap
        work_lost = _work_lost(attempt, following, committed_at)
        if work_lost is not None:
            trained, unseen = work_lost
            if moved:  # the whole move's cost in one figure: the gap, silence and redo
                failover += trained + unseen
                continue
            if attempt.stop_reason in (StopReason.ROLLED_BACK, StopReason.SDC):
                rolled_back += trained
            else:
                recomputed += trained
            detection += unseen
    return LostTime(
        recomputed_steps_s=recomputed,
        detection_s=detection,
        drain_and_resubmit_s=resubmit,
        preempted_s=preempted,
        segment_boundaries_s=segments,
        startup_and_load_s=startup,
        checkpoint_stalls_s=sum(map(checkpoint_stall_s, checkpoints)),
        rolled_back_s=rolled_back,
        cluster_failover_s=failover,
    )


def _work_lost(
    attempt: Attempt, following: Attempt | None, committed_at: Mapping[int, datetime]
) -> tuple[float, float] | None:
    """What a FAILED attempt cost beyond its gap, as (trained, unseen) seconds; None for an
    attempt that did not fail, or failed before a step that could be lost.

    Work after the checkpoint the next attempt resumed from is lost: from that commit to
    the last step seen it was trained for nothing (recomputed, or rolled back past); from
    there to the attempt's end nobody knew yet (detection). Steps trained but never
    reported count as detection, since the service cannot tell them from silence."""
    if attempt.state != AttemptState.FAILED or attempt.ended_at is None:
        return None
    resume = following.resume_step if following else None
    commit = committed_at.get(resume) if resume is not None else None
    lost_from = max(commit, attempt.started_at or commit) if commit else attempt.first_step_at
    if lost_from is None:
        return None
    progress_end = max(attempt.last_progress_at or lost_from, lost_from)
    trained = seconds_between(lost_from, min(progress_end, attempt.ended_at))
    return trained, seconds_between(progress_end, attempt.ended_at)


def achieved_mfu(plan: dict[str, Any] | None, tokens_per_s: float | None) -> float | None:
    """MFU at a measured throughput, in the plan's convention and on the plan's GPUs.

    For a fixed model, sequence length, GPU count and GPU type, MFU is proportional to
    tokens/s (model FLOPs per token are fixed), so the plan's own ratio converts one into
    the other without redoing the FLOP count.
    """
    if not plan or tokens_per_s is None or not plan.get("tokens_per_s"):
        return None
    return float(plan["mfu"]) * tokens_per_s / float(plan["tokens_per_s"])
