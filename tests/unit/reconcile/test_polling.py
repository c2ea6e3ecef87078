"""Polling: every watched job is read in a bounded number of Slurm calls per tick, and a
sweep's array tasks hand their runs the nodes Slurm chose."""

from __future__ import annotations

import pytest

from service.auth.principal import Principal
from service.db import session_scope
from service.models import AttemptState, Role, RunState
from service.slurm.submit import ArrayRequest
from service.sweeps.schemas import SweepSpec
from service.sweeps.service import create_sweep
from tests.unit.reconcile.conftest import PREFIX, Cluster, link_owner
from tests.unit.reconcile.test_submission import tokens_of


def test_three_jobs_ending_together_cost_one_squeue_and_one_scontrol(cluster: Cluster) -> None:
    runs = [cluster.submit_run(f"r{i}") for i in range(3)]
    cluster.cycle()
    for run_id in runs:
        cluster.slurm.finish(cluster.live_job(run_id), exit_code=1)
    cluster.slurm.calls.clear()
    cluster.tick()
    assert (cluster.slurm.calls["queue"], cluster.slurm.calls["job_details"]) == (1, 1)
    for run_id in runs:
        assert cluster.attempts(run_id)[0].state == AttemptState.FAILED


def submit_sweep(cluster: Cluster, max_parallel: int) -> list[int]:
    spec = SweepSpec.model_validate(
        {
            "name": "lr-sweep",
            "model": "tiny",
            "nodes": 1,
            "gpus_per_node": 1,
            "seq_len": 128,
            "global_batch": 8,
            "steps": 100,
            "sweep": {"grid": {"lr": [1e-3, 2e-3, 3e-3]}, "max_parallel": max_parallel},
        }
    )
    owner = Principal(token_id=0, user="alice", team="ml", role=Role.USER)
    with session_scope() as session:
        link_owner(session, "alice", "alice")
        _, runs = create_sweep(session, spec, cluster.settings, owner)
        return [r.id for r in runs]


def test_a_sweep_is_one_array_whose_tasks_hold_the_nodes_slurm_chose(cluster: Cluster) -> None:
    runs = submit_sweep(cluster, max_parallel=2)
    cluster.tick()
    assert cluster.slurm.calls["submit_array"] == 1 and cluster.slurm.calls["submit"] == 0
    array_id = cluster.slurm.array_job_by_name(f"{PREFIX}-s{cluster.run(runs[0]).sweep_id}")
    assert [cluster.attempts(r)[0].slurm_job_id for r in runs] == [
        f"{array_id}_{task}" for task in range(3)
    ]
    cluster.slurm.schedule()  # two tasks start: the array's limit
    cluster.tick()
    states = [cluster.run(r).state for r in runs]
    assert states == [RunState.RUNNING, RunState.RUNNING, RunState.PENDING]
    first = cluster.run(runs[0])
    assert first.nodes == ["unit001"]  # what Slurm gave task 0, now held like any run's
    assert cluster.slurm.reservation_nodes[first.reservation or ""] == ["unit001"]


def test_an_array_queued_before_a_crash_is_adopted_with_its_tokens(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    runs = submit_sweep(cluster, max_parallel=3)
    sbatch = cluster.slurm.submit_array

    def sbatch_then_die(req: ArrayRequest, tokens: list[str]) -> str:
        array_id = sbatch(req, tokens)
        cluster.slurm.cut_submission_short(
            [job.job_id for job in cluster.slurm.jobs.values() if job.array_id == array_id]
        )
        raise RuntimeError("the service was killed before it recorded the array")

    monkeypatch.setattr(cluster.slurm, "submit_array", sbatch_then_die)
    cluster.tick()
    assert all(cluster.attempts(r)[0].slurm_job_id is None for r in runs)
    monkeypatch.setattr(cluster.slurm, "submit_array", sbatch)
    cluster.tick()
    (array_id,) = {job.array_id for job in cluster.slurm.jobs.values()}
    assert [cluster.attempts(r)[0].slurm_job_id for r in runs] == [
        f"{array_id}_{task}" for task in range(3)
    ]
    assert cluster.slurm.calls["submit_array"] == 1
    for run_id in runs:  # the tokens the tasks were started with stay valid
        (token,) = tokens_of(cluster.attempts(run_id)[0].id)
        assert token.revoked_at is None
    cluster.slurm.schedule()  # the adopter finished the cut-off submission: tasks run
    cluster.tick()
    assert [cluster.run(r).state for r in runs] == [RunState.RUNNING] * 3


def test_a_slurm_outage_ends_no_attempt(cluster: Cluster) -> None:
    """slurmctld not answering is "cannot tell", never "the jobs are gone": the attempts
    keep running and are read again once Slurm answers."""
    run_id = cluster.submit_run("through-an-outage")
    cluster.cycle()
    assert cluster.attempts(run_id)[0].state == AttemptState.RUNNING
    cluster.slurm.break_call("queue")
    cluster.slurm.break_call("job_details")
    for _ in range(3):
        cluster.tick()
    assert cluster.attempts(run_id)[0].state == AttemptState.RUNNING
    assert cluster.run(run_id).num_restarts == 0
    cluster.slurm.heal_call("queue")
    cluster.slurm.heal_call("job_details")
    cluster.tick()
    assert cluster.attempts(run_id)[0].state == AttemptState.RUNNING


def test_queued_array_tasks_cost_no_transaction_and_no_placement_per_tick(
    cluster: Cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sweep's tasks waiting in Slurm for their array's limit: nothing changed, so the
    tick neither locks their runs in polling nor loads them in placement."""
    from service.reconcile import polling
    from service.runs import repository

    submit_sweep(cluster, max_parallel=1)
    cluster.tick()
    cluster.slurm.schedule()  # task 0 runs; tasks 1 and 2 wait for the array's limit
    cluster.tick()
    applied, loaded = [], []
    apply, get_run = polling.apply_observation, repository.get_run
    monkeypatch.setattr(polling, "apply_observation", lambda s, o, p: applied.append(o))
    monkeypatch.setattr(
        repository, "get_run", lambda *a, **kw: loaded.append(a[1]) or get_run(*a, **kw)
    )
    cluster.tick()
    assert applied == [] and loaded == []
    assert apply is not None
