"""Silent data corruption, decided against the fake Slurm (issue 15).

Clean comparisons reach the service with the progress reports; a mismatch is reported as
`worker:sdc` with the odd node and the attempt's last clean step, and every rank exits 1.
The service drains the node with the `sdc:mismatch` signal, swaps in a spare, distrusts the
checkpoints written after the last clean comparison (CORRUPT) and resumes from the newest
one before it. The report is the run's own claim (service/recovery/claims.py): it names only
the attempt's nodes, each drain is one of max_restarts, and past the run's cap of
report-caused drains the on-call gets an incident instead of a drain."""

from __future__ import annotations

import pytest

from contract import StopReason
from service.db import session_scope
from service.errors import InvalidSpec
from service.models import CheckpointState, NodeState, RecoveryAction, RunState
from service.runs.service import run_goodput, run_out
from service.worker_protocol.schemas import ErrorReport, ProgressReport
from service.workers import service as workers
from tests.unit.reconcile.conftest import Cluster
from tests.unit.reconcile.test_checkpoint_trust import fail_job, live_attempt_id, running, states


def clean_comparison(cluster: Cluster, run_id: int, step: int) -> None:
    """Rank 0's progress report after a comparison that passed (worker/train.py)."""
    body = ProgressReport(
        rank=0, metrics=[{"step": step, "loss": 1.0, "step_time_s": 0.1}], sdc_clean_step=step
    )
    with session_scope() as session:
        workers.record_progress(session, live_attempt_id(cluster, run_id), body, cluster.settings)


def report_sdc(
    cluster: Cluster, run_id: int, step: int, nodes: list[str], clean: int | None
) -> None:
    """What rank 0's HttpReporter.sdc posts before every rank raises."""
    report = ErrorReport(
        rank=0,
        kind="worker:sdc",
        message=f"parameter checksums of data-parallel replicas differ at step {step}",
        step=step,
        nodes=nodes,
        clean_step=clean,
    )
    with session_scope() as session:
        workers.record_error(session, live_attempt_id(cluster, run_id), report)


def test_a_mismatch_drains_the_odd_node_and_resumes_before_the_last_clean_comparison(
    cluster: Cluster,
) -> None:
    cluster.set_spares(1)
    run_id = running(cluster, "sdc", nodes=3, global_batch=12, max_restarts=1, keep_checkpoints=10)
    odd = cluster.run(run_id).nodes[1]
    for step in (10, 20, 30, 40):
        cluster.train(run_id, step)
        if step == 20:
            clean_comparison(cluster, run_id, 20)
    assert cluster.run(run_id).config["sdc_clean_step"] == 20
    other = next(n for n in sorted(cluster.slurm.nodes) if n not in cluster.run(run_id).nodes)
    with pytest.raises(InvalidSpec, match=f"nodes: {other} not among attempt"):
        report_sdc(cluster, run_id, 45, [odd, other], clean=20)  # `other`: not the run's
    with pytest.raises(InvalidSpec, match=f"node: {other} not among attempt"), session_scope() as s:
        # nor writes a line of another node's history
        nccl = ErrorReport(rank=0, node=other, kind="nccl:remote_error", message="forged")
        workers.record_error(s, live_attempt_id(cluster, run_id), nccl)
    report_sdc(cluster, run_id, 45, [odd], clean=20)
    cluster.tick()  # the incident: drain, the attempt ends, a spare takes the node's place

    assert cluster.slurm.nodes[odd].drained and "sdc:mismatch" in cluster.slurm.nodes[odd].reason
    assert cluster.node(odd).state == NodeState.DRAINED
    assert cluster.incidents(other) == [] and not cluster.slurm.nodes[other].drained
    [incident] = cluster.incidents(odd)
    assert incident.signal == "sdc:mismatch" and incident.kind == "sdc"
    first, second = cluster.attempts(run_id)
    assert first.stop_reason == StopReason.SDC
    assert "silent data corruption at step 45" in (first.end_reason or "")
    run = cluster.run(run_id)
    assert odd not in run.nodes and incident.spare_node in run.nodes
    assert run.state == RunState.PENDING
    assert (run.num_restarts, run.num_hardware_restarts) == (1, 0)  # one of max_restarts
    # Checkpoints after the clean comparison may hold the corruption: never resumed from.
    assert states(cluster, run_id) == {
        10: CheckpointState.COMMITTED,
        20: CheckpointState.COMMITTED,
        30: CheckpointState.CORRUPT,
        40: CheckpointState.CORRUPT,
    }
    assert second.resume_step == 20
    assert "run.rolled_back" in cluster.events(run_id)
    with session_scope() as session:
        out = run_out(run, run_goodput(session, run))
    [row] = out.rollbacks
    assert row["kind"] == "sdc" and row["nodes"] == [odd] and row["resume_step"] == 20
    assert run.config["sdc_clean_step"] == 20

    # The ranks' own exit, seen after the drain: nothing more happens.
    cluster.slurm.schedule()
    cluster.tick()
    assert cluster.run(run_id).state == RunState.RUNNING


def test_the_job_ending_before_the_drain_rolls_back_the_same_way(cluster: Cluster) -> None:
    cluster.set_spares(1)
    run_id = running(cluster, "sdc-exit-first", nodes=3, global_batch=12, keep_checkpoints=10)
    a, b, c = cluster.run(run_id).nodes
    cluster.train(run_id, 10)
    cluster.train(run_id, 20)
    # No comparison passed in this run yet: every checkpoint is distrusted, and both
    # replicas of a set without a majority are named.
    report_sdc(cluster, run_id, 25, [b, c], clean=None)
    fail_job(cluster, run_id)
    run = cluster.run(run_id)
    assert cluster.attempts(run_id)[0].stop_reason == StopReason.SDC
    assert set(states(cluster, run_id).values()) == {CheckpointState.CORRUPT}
    assert cluster.attempts(run_id)[-1].resume_step is None  # from scratch
    assert {n for n in (b, c) if cluster.node(n).state == NodeState.DRAINED} == {b, c}
    assert a in run.nodes


def test_a_clean_comparison_of_an_abandoned_timeline_vouches_for_nothing_after_it(
    cluster: Cluster,
) -> None:
    """Attempt 1 compared clean at step 100 while its save of 90 was still being written,
    then its job failed: attempt 2 resumes from 60, on a node that corrupts it from step 61
    on, and commits 90 again. The mismatch at 100 must distrust that 90: the clean
    comparison at 100 was of attempt 1's timeline, not of attempt 2's."""
    cluster.set_spares(1)
    run_id = running(cluster, "sdc-timeline", nodes=3, global_batch=12, keep_checkpoints=10)
    for step in (30, 60):
        cluster.train(run_id, step)
    cluster.train(run_id, 90, committed=False)  # written, not yet committed
    clean_comparison(cluster, run_id, 100)
    fail_job(cluster, run_id)  # an exception: attempt 2 resumes from 60
    second = live_attempt_id(cluster, run_id)
    assert cluster.attempts(run_id)[1].resume_step == 60
    cluster.train(run_id, 90)  # attempt 2's 90, after the corruption began
    odd = cluster.run(run_id).nodes[1]
    report_sdc(cluster, run_id, 100, [odd], clean=None)  # attempt 2 never compared clean
    cluster.tick()
    assert live_attempt_id(cluster, run_id) != second
    assert states(cluster, run_id)[90] == CheckpointState.CORRUPT
    assert cluster.attempts(run_id)[-1].resume_step == 60


def test_a_script_reporting_sdc_in_a_loop_drains_at_most_the_cap_and_uses_its_restarts(
    cluster: Cluster,
) -> None:
    """A run's code posts `worker:sdc` naming one of its nodes, attempt after attempt: the
    first report_drains_per_run (2) drain and move the run; past them the on-call gets an
    incident and nothing is drained; every SDC restart is one of max_restarts, so the run
    fails when they are used up instead of walking across the cluster."""
    assert cluster.settings.report_drains_per_run == 2
    cluster.set_spares(3)
    run_id = running(cluster, "sdc-loop", nodes=2, max_restarts=3, keep_checkpoints=10)
    named: list[str] = []
    for round_ in range(4):
        cluster.train(run_id, 10 * (round_ + 1))
        victim = cluster.run(run_id).nodes[0]
        named.append(victim)
        report_sdc(cluster, run_id, 10 * (round_ + 1) + 5, [victim], clean=None)
        fail_job(cluster, run_id)
        if cluster.run(run_id).state.is_terminal:
            break
        cluster.cycle()
    drained = [n for n in named if cluster.node(n).state == NodeState.DRAINED]
    assert drained == named[:2], (named, drained)  # the cap: two drains in the window
    for node in named[2:]:
        assert not cluster.slurm.nodes[node].drained
        capped = [i for i in cluster.incidents(node) if i.signal == "report:drain_cap"]
        assert capped and all(i.action == RecoveryAction.OBSERVE for i in capped)
        assert all("on-call" in i.message for i in capped)
    run = cluster.run(run_id)
    assert run.num_hardware_restarts == 0 and run.num_restarts == 3
    assert run.state == RunState.FAILED and "no restarts left" in run.state_reason
