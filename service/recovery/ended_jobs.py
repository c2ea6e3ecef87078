"""The jobs of attempts that ended in Postgres but still run in Slurm: scancelled.

Every path that ends an attempt (a node failure moving the run to a spare, a hang restarted
in place, a failed replica group, the classic path ending every group) records the end
first and scancels the job after, so a service killed between the two, or an scancel that
slurmctld did not answer (scancel reports nothing), leaves a job running for an attempt
nothing polls any more. It holds the run's nodes (jobs are exclusive), so the next attempt
on them waits, and its ranks may still write to the run's checkpoint folder. This step
derives what to cancel from Postgres each tick, so the scancel happens once it is needed,
whichever path ended the attempt and however often the earlier try was lost.

An attempt that failed over to another cluster (reconcile/failover.py) ended while its
cluster did not answer: its job is cancelled when the cluster answers again, so the run's
old copy does not train beside the new one.

Not STOPPED attempts (preempted or at a segment's end: their jobs stop on their own, at a
committed checkpoint) and not SUCCEEDED ones (their jobs are ending).
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import select

from contract import StopReason
from service.db import session_scope
from service.models import Attempt, AttemptState, Run
from service.models.base import utcnow
from service.slurm.client import SlurmClient

ENDED_BY_US = (AttemptState.FAILED, AttemptState.CANCELLED)
LOOK_BACK = timedelta(hours=1)  # older ended attempts' jobs were cancelled or have ended


def cancel_jobs_of_ended_attempts(slurm: SlurmClient, within: timedelta = LOOK_BACK) -> None:
    """scancel the jobs Slurm still runs for attempts Postgres says failed or were cancelled,
    each as its run owner's (SlurmClient.cancel); the jobs on `slurm`'s cluster."""
    with session_scope() as session:
        rows = session.execute(
            select(Attempt.slurm_job_id, Run.unix_user)
            .join(Run, Run.id == Attempt.run_id)
            .where(
                Attempt.state.in_(ENDED_BY_US),
                Attempt.slurm_job_id.is_not(None),
                # An attempt that failed over left a cluster that may answer only days
                # later: its job is cancelled then, however long ago it ended.
                (Attempt.ended_at > utcnow() - within)
                | (Attempt.stop_reason == StopReason.CLUSTER_FAILOVER),
                Attempt.cluster == slurm.cluster_name,
            )
        ).all()
        owner_of_job = {job: owner for job, owner in rows if job}
    if not owner_of_job:
        return
    live = slurm.queue(list(owner_of_job))
    still = {job: owner for job, owner in owner_of_job.items() if job in live and live[job].is_live}
    if still:
        slurm.cancel(still)
