"""Replica-group runs: one Slurm job per group; a node failure ends only its group's job
and a spare's replacement heals from a live peer (the fast path); two at once fall back to
disk (the classic path); a service killed mid-recovery finishes it exactly once."""

from __future__ import annotations

import os

import pytest

from contract import StopReason, WorkerRunConfig
from service.db import session_scope
from service.models import (
    Attempt,
    AttemptState,
    ClassicBecause,
    IncidentState,
    RecoveryPath,
    Run,
    RunState,
)
from service.reconcile import polling
from service.reconcile.loop import Reconciler
from service.recovery import lighthouse, spares
from service.recovery.incidents import process_incidents
from service.runs import repository
from service.runs.service import run_goodput, worker_config
from service.worker_protocol.schemas import (
    CheckpointReport,
    ErrorReport,
    FinishReport,
    ProgressReport,
)
from service.workers import service as workers
from tests.fixtures.rows import checkpoint_path
from tests.unit.reconcile.conftest import Cluster


@pytest.fixture(autouse=True)
def no_lighthouse_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The lighthouse is a process on the service host; these decision tests only need its
    address recorded (the integration tests start the real one)."""
    monkeypatch.setattr(lighthouse, "start", lambda *a: ("http://127.0.0.1:29510", os.getpid()))
    monkeypatch.setattr(lighthouse, "is_alive", lambda pid: pid is not None)


def live_groups(cluster: Cluster, run_id: int) -> dict[int, Attempt]:
    return {
        a.replica_group: a
        for a in cluster.attempts(run_id)
        if not a.state.is_terminal and a.replica_group is not None
    }


def report(attempt_id: int, step: int, *, checkpoint: bool = False) -> None:
    """A group's rank 0 reports `step` (and the checkpoint there when it writes it)."""
    with session_scope() as session:
        workers.record_progress(
            session,
            attempt_id,
            ProgressReport(rank=0, metrics=[{"step": step, "loss": 1.0, "step_time_s": 0.1}]),
        )
        if checkpoint:
            attempt = session.get(Attempt, attempt_id)
            run = session.get(Run, attempt.run_id) if attempt else None
            assert run is not None
            at = CheckpointReport(step=step, path=checkpoint_path(run, step), state="COMMITTED")
            workers.record_checkpoint(session, attempt_id, at)


def two_groups_training(cluster: Cluster) -> tuple[int, dict[int, Attempt]]:
    cluster.set_spares(1)
    run_id = cluster.submit_run("ft", fault_tolerance={"replica_groups": 2})
    cluster.cycle()
    groups = live_groups(cluster, run_id)
    assert sorted(groups) == [0, 1] and cluster.run(run_id).state == RunState.RUNNING
    for g, attempt in groups.items():
        assert attempt.state == AttemptState.RUNNING
        assert attempt.nodes == cluster.run(run_id).nodes[g : g + 1]  # one node each
        report(attempt.id, 20, checkpoint=g == 0)
    assert cluster.run(run_id).lighthouse_addr == "http://127.0.0.1:29510"
    return run_id, groups


def test_a_node_failure_replaces_only_its_group_and_the_other_keeps_its_job(
    cluster: Cluster,
) -> None:
    run_id, groups = two_groups_training(cluster)
    bad = groups[1].nodes[0]
    survivor_job = groups[0].slurm_job_id

    cluster.xid(bad)
    cluster.tick()

    run = cluster.run(run_id)
    assert run.state == RunState.RUNNING  # the run never stopped
    assert cluster.slurm.jobs[survivor_job].state == "RUNNING"
    assert cluster.slurm.jobs[groups[1].slurm_job_id].state == "CANCELLED"
    failed = next(a for a in cluster.attempts(run_id) if a.id == groups[1].id)
    assert failed.state == AttemptState.FAILED and failed.stop_reason == StopReason.NODE_FAILURE
    replacement = live_groups(cluster, run_id)[1]
    spare = run.nodes[1]
    assert spare != bad and replacement.nodes == [spare]
    assert replacement.resume_step is None  # it heals from group 0, not from disk
    assert cluster.slurm.jobs[replacement.slurm_job_id].nodelist == (spare,)
    (incident,) = cluster.incidents(bad)
    assert incident.recovery_path == RecoveryPath.FAST and incident.classic_because is None
    assert incident.spare_node == spare and incident.submitted_at is not None
    assert "recovery.fast_path" in cluster.events(run_id)

    cluster.slurm.schedule()
    cluster.tick()
    report(replacement.id, 24)  # healed at step 23, trained 24
    (incident,) = cluster.incidents(bad)
    assert incident.state == IncidentState.RESOLVED and incident.first_step_at is not None
    with session_scope() as session:
        goodput = run_goodput(session, cluster.run(run_id))
    # Group 1's share idled from its last report to its replacement's first step.
    assert goodput.lost.degraded_s > 0 and goodput.lost.drain_and_resubmit_s == 0


def test_both_groups_failing_at_once_restart_every_group_from_disk(cluster: Cluster) -> None:
    run_id, groups = two_groups_training(cluster)
    cluster.set_spares(2)
    cluster.tick()
    first, second = groups[0].nodes[0], groups[1].nodes[0]

    cluster.xid(first)
    cluster.xid(second)
    cluster.tick()

    paths = {n: cluster.incidents(n)[0] for n in (first, second)}
    assert paths[first].recovery_path == RecoveryPath.FAST
    assert paths[second].recovery_path == RecoveryPath.CLASSIC
    assert paths[second].classic_because == ClassicBecause.ALL_COPIES_LOST
    cluster.cycle()
    run = cluster.run(run_id)
    live = live_groups(cluster, run_id)
    assert sorted(live) == [0, 1] and run.state == RunState.RUNNING
    assert all(a.resume_step == 20 for a in live.values())  # both from the disk checkpoint
    assert first not in run.nodes and second not in run.nodes


def test_a_service_killed_after_deciding_the_fast_path_submits_the_replacement_once(
    cluster: Cluster,
) -> None:
    run_id, groups = two_groups_training(cluster)
    bad = groups[1].nodes[0]
    cluster.xid(bad)
    # The service dies right after the incident's transaction: the decision and the
    # replacement attempt are in Postgres, its sbatch is not done.
    process_incidents(cluster.settings, cluster.slurm)
    replacement = live_groups(cluster, run_id)[1]
    assert replacement.state == AttemptState.SUBMITTING and replacement.slurm_job_id is None

    cluster.reconciler = Reconciler(cluster.settings, cluster.slurm)  # a fresh service
    cluster.tick(3)

    assert len(cluster.slurm.jobs_named(replacement.job_name)) == 1
    assert live_groups(cluster, run_id)[1].state == AttemptState.PENDING
    assert cluster.slurm.jobs[groups[0].slurm_job_id].state == "RUNNING"
    (incident,) = cluster.incidents(bad)
    assert incident.recovery_path == RecoveryPath.FAST
    assert sum(a.replica_group == 1 for a in cluster.attempts(run_id)) == 2


def test_without_a_spare_the_group_waits_and_rejoins_when_the_pool_refills(
    cluster: Cluster,
) -> None:
    run_id, groups = two_groups_training(cluster)
    spare = cluster.run(run_id).nodes  # placed; the pool's one spare is elsewhere
    cluster.set_spares(0)
    cluster.tick()
    bad = groups[1].nodes[0]
    cluster.xid(bad)
    cluster.tick(2)
    assert 1 not in live_groups(cluster, run_id)  # group 1 waits, group 0 trains on
    assert cluster.run(run_id).state == RunState.RUNNING
    (incident,) = cluster.incidents(bad)
    assert incident.state == IncidentState.WAITING and incident.recovery_path == RecoveryPath.FAST

    cluster.set_spares(1)
    cluster.tick(2)
    replacement = live_groups(cluster, run_id)[1]
    assert replacement.resume_step is None and bad not in replacement.nodes
    assert replacement.nodes[0] not in spare and replacement.slurm_job_id is not None


def test_a_group_that_trained_the_last_step_is_not_replaced_and_the_last_to_leave_decides(
    cluster: Cluster,
) -> None:
    run_id, groups = two_groups_training(cluster)
    total = cluster.run(run_id).total_steps
    report(groups[1].id, total)  # group 1 trained the last step and leaves first
    cluster.slurm.finish(groups[1].slurm_job_id)
    cluster.tick()
    attempts = {a.id: a for a in cluster.attempts(run_id)}
    assert attempts[groups[1].id].state == AttemptState.SUCCEEDED
    assert len(attempts) == 2 and cluster.run(run_id).state == RunState.RUNNING  # no replacement

    report(groups[0].id, total, checkpoint=True)  # the writer commits the final checkpoint
    with session_scope() as session:
        workers.record_finish(session, groups[0].id, FinishReport(final_step=total))
    cluster.slurm.finish(groups[0].slurm_job_id)
    cluster.tick()
    assert cluster.run(run_id).state == RunState.SUCCEEDED


@pytest.mark.parametrize("reserve", [0, 1])
def test_a_group_that_lost_every_node_takes_spares_only_if_the_reserve_stays(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch, reserve: int
) -> None:
    """The service hands out spares by the policy the failure simulation calls
    (spares.spares_to_grant): a group that lost several nodes at once (a leaf switch) takes
    them only if the pool keeps the reserve for independent failures; else it waits while
    the other group trains. The reserve is 0 at this run's size; 1 stands for a big run."""
    monkeypatch.setattr(spares, "reserve_for", lambda rate, *a, **k: reserve)
    cluster.set_spares(2)
    run_id = cluster.submit_run("ft", nodes=4, fault_tolerance={"replica_groups": 2})
    cluster.cycle()
    groups = live_groups(cluster, run_id)
    for g, attempt in groups.items():
        report(attempt.id, 20, checkpoint=g == 0)
    lost = groups[1].nodes
    assert len(lost) == 2

    for node in lost:
        cluster.xid(node)
    cluster.tick(2)

    run = cluster.run(run_id)
    assert run.state == RunState.RUNNING  # group 0 trains on either way
    assert cluster.slurm.jobs[groups[0].slurm_job_id].state == "RUNNING"
    replacement = live_groups(cluster, run_id).get(1)
    if reserve:
        assert replacement is None  # both spares would empty the pool: the group waits
        assert all(i.state == IncidentState.WAITING for n in lost for i in cluster.incidents(n))
        with session_scope() as session:
            assert len(spares.spare_nodes(session, "default")) == 2
    else:
        assert replacement is not None and not set(replacement.nodes) & set(lost)
        assert len(replacement.nodes) == 2 and replacement.resume_step is None


def test_a_group_that_stopped_for_a_loss_spike_rolls_every_group_back_from_disk(
    cluster: Cluster,
) -> None:
    """Not the fast path: the other groups saw (or will see) the same spike; a replacement
    would heal the anomaly's state from them. Every group resumes from the checkpoint
    before it with the data skipped, as a run without groups does."""
    run_id, groups = two_groups_training(cluster)
    report(groups[1].id, 30)
    with session_scope() as session:
        anomaly = ErrorReport(rank=0, kind="worker:anomaly", step=30, message="non-finite loss")
        workers.record_error(session, groups[1].id, anomaly)
    cluster.slurm.finish(groups[1].slurm_job_id, exit_code=1)
    cluster.tick()

    attempts = {a.id: a for a in cluster.attempts(run_id)}
    assert attempts[groups[1].id].stop_reason == StopReason.ROLLED_BACK
    assert attempts[groups[0].id].state == AttemptState.FAILED  # stopped with it
    assert "run.rolled_back" in cluster.events(run_id)
    cluster.cycle()
    live = live_groups(cluster, run_id)
    assert sorted(live) == [0, 1]
    assert all(a.resume_step == 20 for a in live.values())  # both from disk, before the spike
    assert cluster.run(run_id).config["data_skips"]  # the spike's data is skipped


def worker_configs(cluster: Cluster, run_id: int) -> dict[int, WorkerRunConfig]:
    """What each live group's ranks would be told to train (GET .../config)."""
    with session_scope() as session:
        run = repository.get_run(session, run_id)
        assert run is not None
        live = [a for a in run.attempts if not a.state.is_terminal and a.replica_group is not None]
        return {
            a.replica_group: worker_config(session, run, a, cluster.settings)
            for a in live
            if a.replica_group is not None
        }


@pytest.mark.parametrize("checkpoint", [True, False], ids=["from-checkpoint", "from-scratch"])
def test_every_group_restarting_from_disk_at_once_starts_without_a_peer(
    cluster: Cluster, checkpoint: bool
) -> None:
    """A rollback restarts every group together: with no checkpoint yet each new attempt
    starts from step 0, and none waits for a live group to heal from (there is none: the
    run failed with NoPeerToHealFromError when the service read 'no resume step and an
    earlier attempt of the group' as a replacement)."""
    cluster.set_spares(1)
    run_id = cluster.submit_run("ft-disk", fault_tolerance={"replica_groups": 2})
    cluster.cycle()
    groups = live_groups(cluster, run_id)
    for g, attempt in groups.items():
        report(attempt.id, 20, checkpoint=checkpoint and g == 0)
    with session_scope() as session:
        spike = ErrorReport(rank=0, kind="worker:anomaly", step=25, message="non-finite loss")
        workers.record_error(session, groups[1].id, spike)
    cluster.slurm.finish(groups[1].slurm_job_id, exit_code=1)
    cluster.tick()
    cluster.cycle()

    configs = worker_configs(cluster, run_id)
    assert sorted(configs) == [0, 1]
    for config in configs.values():
        assert config.fault_tolerance is not None
        assert config.fault_tolerance.heal_from_peer is False
        assert config.resume_from is None or config.resume_from.step == 20
        assert (config.resume_from is not None) == checkpoint
    # The run trains on: both groups run, and a later node loss still takes the fast path
    # with a replacement that heals from the survivor.
    live = live_groups(cluster, run_id)
    assert all(a.state == AttemptState.RUNNING for a in live.values())
    for attempt in live.values():
        report(attempt.id, 30)
    cluster.xid(live[1].nodes[0])
    cluster.tick()
    cluster.cycle()
    replacement = worker_configs(cluster, run_id)[1]
    assert replacement.fault_tolerance is not None and replacement.fault_tolerance.heal_from_peer
    assert replacement.resume_from is None


def four_groups_training(cluster: Cluster, name: str) -> tuple[int, dict[int, Attempt]]:
    cluster.set_spares(1)
    run_id = cluster.submit_run(
        name, nodes=4, global_batch=8, max_restarts=1, fault_tolerance={"replica_groups": 4}
    )
    cluster.cycle()
    groups = live_groups(cluster, run_id)
    assert sorted(groups) == [0, 1, 2, 3]
    for g, attempt in groups.items():
        report(attempt.id, 20, checkpoint=g == 0)
    return run_id, groups


def outvoted(cluster: Cluster, attempt: Attempt, *, majority: bool = True) -> None:
    """Group `attempt`'s rank 0 reports that the other groups outvoted it at step 25."""
    sdc = ErrorReport(
        rank=0,
        kind="worker:sdc",
        step=25,
        nodes=list(attempt.nodes),
        clean_step=20,
        outvoted=majority,
        message="parameter checksums of data-parallel replicas differ at step 25",
    )
    with session_scope() as session:
        workers.record_error(session, attempt.id, sdc)


@pytest.mark.parametrize("first", ["incident", "job_end"])
def test_a_group_outvoted_by_three_is_replaced_once_whichever_is_seen_first(
    cluster: Cluster, first: str
) -> None:
    """The SDC incident (drain) and the outvoted group's job end reach the service in either
    order: the group is replaced on the spare, healing from the others, which never stop;
    one restart of max_restarts is counted, none a hardware one; nothing rolls back."""
    run_id, groups = four_groups_training(cluster, f"four-{first}")
    odd = groups[1]
    bad = odd.nodes[0]
    outvoted(cluster, odd)
    if first == "job_end":  # judged before the reconciler's incidents step sees the report
        cluster.slurm.finish(odd.slurm_job_id, exit_code=1)
        polling.poll_attempts(cluster.settings, cluster.slurm)
    cluster.tick()
    cluster.slurm.finish(odd.slurm_job_id, exit_code=1)
    cluster.cycle()

    run = cluster.run(run_id)
    assert run.state == RunState.RUNNING, run.state_reason
    live = live_groups(cluster, run_id)
    for g in (0, 2, 3):  # the majority kept its attempts
        assert live[g].id == groups[g].id and live[g].state == AttemptState.RUNNING
    assert live[1].id != odd.id and bad not in live[1].nodes and live[1].heals_from_peer
    assert (run.num_restarts, run.num_hardware_restarts) == (1, 0)
    assert cluster.node(bad).state.value in ("DRAINING", "DRAINED")
    assert "run.rolled_back" not in cluster.events(run_id)
    assert [a.id for a in cluster.attempts(run_id) if a.replica_group == 1] == [odd.id, live[1].id]


def test_groups_without_a_majority_roll_back_through_the_reporting_group(cluster: Cluster) -> None:
    """Two groups disagree: neither copy is trusted. Every group stops; the restart is
    decided on the reporting group's attempt, so the checkpoints after its last clean
    comparison are distrusted and it is one of max_restarts."""
    run_id, groups = two_groups_training(cluster)
    with session_scope() as session:
        sdc = ErrorReport(
            rank=0,
            kind="worker:sdc",
            step=25,
            nodes=list(groups[1].nodes),
            clean_step=10,
            message="parameter checksums of data-parallel replicas differ at step 25",
        )
        workers.record_error(session, groups[1].id, sdc)
    cluster.tick()
    cluster.cycle()
    run = cluster.run(run_id)
    assert "run.rolled_back" in cluster.events(run_id)
    assert run.num_hardware_restarts == 0 and run.num_restarts == 1
    assert all(a.resume_step is None for a in live_groups(cluster, run_id).values())
