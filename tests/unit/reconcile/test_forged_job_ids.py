"""A job id the service records, polls and cancels is the run owner's job (issue 38).

The owner's program answers sbatch's job id on its last line of stdout, and the owner may
write to that process; the service scancels with a Slurm administrator's rights. So an
answer is recorded only once slurmctld shows that job running as the owner under the
attempt's name, and every scancel the service issues for a run's job names the owner
(scancel --user), which the fake Slurm models: a cancel of another user's job is ignored.
Bob's job here is someone else's job on the same cluster, running the whole time.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta

import pytest

from contract import StopReason
from service.db import session_scope
from service.models import AttemptState, RunState
from service.models.base import utcnow
from service.reconcile import preemption
from service.recovery import ended_jobs
from service.runs import repository
from service.runs.service import cancel_run
from tests.unit.reconcile.conftest import Cluster


def bobs_job(cluster: Cluster) -> str:
    """Bob's own job, running on the node alice's runs are placed on last."""
    return cluster.slurm.run_foreign_job("bobs-own", ["unit006"], user="bob")


def test_an_answer_naming_an_id_not_given_out_yet_is_refused_and_bobs_job_keeps_it(
    cluster: Cluster,
) -> None:
    """The finding: alice's program answers with the next job id, which slurmctld does not
    know yet; bob's next sbatch gets it. Recorded as alice's attempt, bob's job would be
    polled as hers and scancelled when her run ends."""
    future = str(cluster.slurm.next_id + 1)  # alice's own sbatch takes next_id
    cluster.slurm.forge_submit_answer(future)
    run_id = cluster.submit_run("forged")
    cluster.tick()
    assert bobs_job(cluster) == future
    cluster.slurm.forge_submit_answer(None)
    cluster.tick(3)  # the ended attempt's sweep, the run's release
    assert cluster.slurm.jobs[future].state == "RUNNING"
    recorded = [a.slurm_job_id for a in cluster.attempts(run_id)]
    assert recorded == [None], f"job ids recorded: {recorded} (bob's is {future})"
    run, (attempt,) = cluster.run(run_id), cluster.attempts(run_id)
    assert attempt.state == AttemptState.FAILED
    assert attempt.stop_reason == StopReason.SUBMISSION_FAILED
    assert run.state == RunState.FAILED
    assert f"answered with job {future}, which slurmctld does not know" in run.state_reason
    assert cluster.slurm.jobs[future].state == "RUNNING"
    # What alice's program did queue under the attempt's name is cancelled, as hers.
    (queued,) = cluster.slurm.jobs_named(attempt.job_name)
    assert (queued.user, queued.state) == ("alice", "CANCELLED")


def test_an_answer_naming_another_users_job_is_refused_and_that_job_left_alone(
    cluster: Cluster,
) -> None:
    theirs = bobs_job(cluster)
    cluster.slurm.forge_submit_answer(theirs)  # alice's program answers with bob's job id
    run_id = cluster.submit_run("forged")
    cluster.tick()
    cluster.slurm.forge_submit_answer(None)
    cluster.tick(3)
    assert cluster.slurm.jobs[theirs].state == "RUNNING"
    recorded = [a.slurm_job_id for a in cluster.attempts(run_id)]
    assert recorded == [None], f"job ids recorded: {recorded} (bob's is {theirs})"
    run, (attempt,) = cluster.run(run_id), cluster.attempts(run_id)
    assert attempt.state == AttemptState.FAILED
    assert f"answered with job {theirs}, which runs as bob" in run.state_reason


def test_an_answer_naming_another_job_of_the_owners_is_refused(cluster: Cluster) -> None:
    """Only the attempt's unique name tells its job from another of alice's."""
    notebook = cluster.slurm.run_foreign_job("alices-notebook", ["unit006"], user="alice")
    cluster.slurm.forge_submit_answer(notebook)
    run_id = cluster.submit_run("forged")
    cluster.tick()
    assert cluster.slurm.jobs[notebook].state == "RUNNING"
    recorded = [a.slurm_job_id for a in cluster.attempts(run_id)]
    assert recorded == [None], f"job ids recorded: {recorded} (the notebook is {notebook})"
    assert cluster.attempts(run_id)[0].state == AttemptState.FAILED
    assert "which is named 'alices-notebook'" in cluster.run(run_id).state_reason


def record_job(cluster: Cluster, run_id: int, job_id: str) -> None:
    """What Postgres would hold had a forged id been recorded (before the check above, or
    by any path yet to come): the live attempt's job is `job_id`."""
    with session_scope() as session:
        run = repository.get_run(session, run_id, for_update=True)
        attempt = repository.live_attempt(run) if run else None
        assert attempt is not None
        attempt.slurm_job_id = job_id


def by_cancelling(cluster: Cluster, run_id: int) -> None:
    with session_scope() as session:
        cancel_run(session, run_id, now=True)
    cluster.tick()


def by_failing(cluster: Cluster, run_id: int) -> None:
    """The attempt ended in Postgres; ended_jobs scancels what Slurm still runs for it."""
    with session_scope() as session:
        run = repository.get_run(session, run_id, for_update=True)
        attempt = repository.live_attempt(run) if run else None
        assert attempt is not None
        attempt.state, attempt.ended_at = AttemptState.FAILED, utcnow()
    ended_jobs.cancel_jobs_of_ended_attempts(cluster.slurm)


def by_ignoring_a_stop(cluster: Cluster, run_id: int) -> None:
    cluster.age_attempt(run_id, stop_requested_at=utcnow() - timedelta(hours=1))
    preemption.enforce_stop_deadlines(cluster.settings, cluster.slurm)


def by_losing_a_node(cluster: Cluster, run_id: int) -> None:
    cluster.xid(cluster.run(run_id).nodes[0])
    cluster.tick()


@pytest.mark.parametrize(
    "end",
    [by_cancelling, by_failing, by_ignoring_a_stop, by_losing_a_node],
    ids=lambda f: f.__name__,
)
def test_every_scancel_of_a_runs_job_is_as_its_owner(
    cluster: Cluster, end: Callable[[Cluster, int], None]
) -> None:
    """Cancellation, an ended attempt's sweep, a stop deadline and a node failure each
    scancel the job recorded for the run: with alice's user, so bob's job, recorded as
    hers, keeps running."""
    run_id = cluster.submit_run("owned")
    cluster.cycle()
    theirs = bobs_job(cluster)
    record_job(cluster, run_id, theirs)
    before = cluster.slurm.calls["cancel"]
    end(cluster, run_id)
    assert cluster.slurm.calls["cancel"] > before, "the path did not scancel"
    assert cluster.slurm.jobs[theirs].state == "RUNNING"
