"""The end-of-job verdict: success only on the worker's final step with its checkpoint
committed; a failure restarts within max_restarts; do-not-retry fails the run at once; a
job cancelled or forgotten behind the service's back is a failure like any other."""

from __future__ import annotations

from contract import ExitCode, StopReason
from service.models import AttemptState, RunState
from service.slurm.fake import CANCELLED_EXIT
from tests.unit.reconcile.conftest import Cluster


def running(cluster: Cluster, name: str, **spec: object) -> int:
    run_id = cluster.submit_run(name, **spec)
    cluster.cycle()
    assert cluster.run(run_id).state == RunState.RUNNING
    return run_id


def test_a_run_that_trained_every_step_succeeds_and_gives_its_nodes_back(
    cluster: Cluster,
) -> None:
    run_id = running(cluster, "completes")
    reservation = cluster.run(run_id).reservation
    cluster.finish_training(run_id)
    cluster.slurm.finish(cluster.live_job(run_id), exit_code=0)
    cluster.tick()
    run = cluster.run(run_id)
    (attempt,) = cluster.attempts(run_id)
    assert run.state == RunState.SUCCEEDED
    assert attempt.state == AttemptState.SUCCEEDED and attempt.stop_reason == StopReason.COMPLETED
    assert run.reservation is None and reservation not in cluster.slurm.reservation_nodes
    assert cluster.events(run_id)[-1] == "run.released"


def test_exit_0_without_the_final_step_is_a_failure_and_restarts(cluster: Cluster) -> None:
    run_id = running(cluster, "exit-0-early")
    cluster.train(run_id, 40)
    cluster.slurm.finish(cluster.live_job(run_id), exit_code=0)
    cluster.tick(2)  # the verdict, then the next attempt's submission
    failed, retry = cluster.attempts(run_id)
    assert failed.state == AttemptState.FAILED and failed.stop_reason == StopReason.JOB_FAILED
    assert "before the worker reported its final step" in (failed.end_reason or "")
    run = cluster.run(run_id)
    assert run.state == RunState.PENDING and run.num_restarts == 1
    # Same nodes, same reservation, from the newest committed checkpoint.
    assert retry.resume_step == 40 and retry.state == AttemptState.PENDING
    assert cluster.slurm.jobs[retry.slurm_job_id].nodelist == ("unit001", "unit002")


def test_a_failing_run_restarts_max_restarts_times_then_fails(cluster: Cluster) -> None:
    run_id = running(cluster, "keeps-failing", max_restarts=2)
    for _ in range(3):
        cluster.slurm.schedule()
        cluster.tick()
        cluster.slurm.finish(cluster.live_job(run_id), exit_code=1)
        cluster.tick()
    run = cluster.run(run_id)
    assert run.state == RunState.FAILED and "no restarts left (2 allowed)" in run.state_reason
    assert [a.exit_code for a in cluster.attempts(run_id)] == [1, 1, 1]
    assert run.reservation is None


def test_do_not_retry_fails_the_run_at_once(cluster: Cluster) -> None:
    reported = running(cluster, "worker-said-so")
    cluster.worker_error(reported, "worker:do_not_retry")
    cluster.slurm.finish(cluster.live_job(reported), exit_code=1)  # Slurm's code may be 1
    by_code = running(cluster, "exit-code-says-so")
    cluster.slurm.finish(cluster.live_job(by_code), exit_code=ExitCode.DO_NOT_RETRY)
    cluster.tick()
    for run_id in (reported, by_code):
        run = cluster.run(run_id)
        (attempt,) = cluster.attempts(run_id)
        assert run.state == RunState.FAILED and "refused to retry" in run.state_reason
        assert attempt.stop_reason == StopReason.DO_NOT_RETRY and run.num_restarts == 0


def test_a_job_cancelled_behind_the_services_back_is_a_failure(cluster: Cluster) -> None:
    run_id = running(cluster, "admin-scancel")
    cluster.slurm.scancel_by_hand([cluster.live_job(run_id)])  # an admin, not runyard
    cluster.tick(2)
    failed = cluster.attempts(run_id)[0]
    assert failed.exit_code == CANCELLED_EXIT and "ended CANCELLED" in (failed.end_reason or "")
    assert cluster.run(run_id).num_restarts == 1 and len(cluster.attempts(run_id)) == 2


def test_a_job_slurm_forgot_is_a_failure(cluster: Cluster) -> None:
    run_id = running(cluster, "forgotten")
    job = cluster.live_job(run_id)
    cluster.slurm.finish(job, exit_code=0)
    cluster.slurm.forget(job)  # the service was down longer than MinJobAge
    cluster.tick()
    failed = cluster.attempts(run_id)[0]
    assert failed.state == AttemptState.FAILED and failed.exit_code is None
    assert "UNKNOWN (slurmctld forgot the job)" in (failed.end_reason or "")


def test_a_node_failure_ends_the_job_node_fail(cluster: Cluster) -> None:
    """NODE_FAIL from Slurm before any agent spoke: the run restarts off the dead node."""
    cluster.set_spares(1)
    run_id = running(cluster, "node-fail")
    bad = cluster.run(run_id).nodes[0]
    cluster.slurm.fail_node(bad)
    cluster.tick(2)
    first = cluster.attempts(run_id)[0]
    assert first.state == AttemptState.FAILED and "NODE_FAIL" in (first.end_reason or "")
    retry = cluster.attempts(run_id)[-1]
    assert bad not in cluster.slurm.jobs[retry.slurm_job_id].nodelist
    assert cluster.slurm.nodes[bad].drained
    # The node, not the run, failed: it uses up no restart of the run's own.
    run = cluster.run(run_id)
    assert first.stop_reason == StopReason.NODE_FAILURE
    assert run.num_hardware_restarts == run.num_restarts == 1
