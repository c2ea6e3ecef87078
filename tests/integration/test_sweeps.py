"""A sweep is one Slurm job array with a parallelism limit; its runs recover like any run."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from typing import Any

import pytest

from client.api import RunyardClient
from tests.conftest import wait_for
from tests.integration.conftest import (
    Agents,
    ServiceProcess,
    committed,
    drain_reason,
    slurm,
    tiny_spec,
)

pytestmark = pytest.mark.integration

XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, name=python, GPU has fallen off the bus."


def sweep_spec(name: str, grid: dict[str, list[Any]], max_parallel: int, **run: Any) -> dict:
    return {
        **tiny_spec(name, nodes=1, **run),
        "sweep": {"grid": grid, "max_parallel": max_parallel},
    }


def job_fields(job_id: str, conf: str) -> dict[str, str]:
    line = slurm("scontrol", "show", "job", "-o", job_id, conf=conf)
    return dict(t.partition("=")[::2] for t in line.split() if "=" in t)


def queued(client: RunyardClient, sweep_id: int) -> dict:
    return wait_for(
        "the sweep's job array to be queued",
        lambda: (s := client.get_sweep(sweep_id))["slurm_array_job_id"] and s,
    )


@pytest.mark.whole_path
def test_a_sweep_is_one_job_array_that_runs_at_most_its_limit_at_once(
    service: ServiceProcess, slurm_cluster
) -> None:
    client, conf = service.client(), str(slurm_cluster.slurm_conf)
    grid = {"lr": [1e-3, 3e-3, 1e-2]}
    sweep = client.submit_sweep(sweep_spec("sweep-limit", grid, max_parallel=2, steps=40))
    array = queued(client, sweep["id"])["slurm_array_job_id"]

    runs = client.get_sweep(sweep["id"])["runs"]
    assert [r["slurm_job_id"] for r in runs] == [f"{array}_{i}" for i in range(3)]
    for task, r in enumerate(runs):
        fields = job_fields(r["slurm_job_id"], conf)
        assert fields["ArrayJobId"] == array and fields["ArrayTaskId"] == str(task)
    # The limit is Slurm's own (%2 on the array), not something runyard emulates.
    assert "%2" in slurm("squeue", "-h", "-j", array, "-o", "%K", conf=conf) or any(
        job_fields(f"{array}_{i}", conf).get("ArrayTaskThrottle") == "2" for i in range(3)
    )

    wait_for(
        "every run of the sweep to succeed",
        lambda: client.get_sweep(sweep["id"])["state"] == "SUCCEEDED",
        timeout_s=240,
    )
    done = client.get_sweep(sweep["id"])
    assert done["counts"] == {"SUCCEEDED": 3}
    spans = []
    for r in done["runs"]:
        run = client.get_run(r["id"])
        assert len(run["attempts"]) == 1 and run["spec"]["lr"] == r["params"]["lr"]
        assert run["last_step"] == 40
        fields = job_fields(r["slurm_job_id"], conf)
        spans.append(
            (datetime.fromisoformat(fields["StartTime"]), datetime.fromisoformat(fields["EndTime"]))
        )
    # Never three at once: the third task started only once one of the first two ended.
    starts = sorted(spans)
    assert starts[2][0] >= min(end for _, end in starts[:2])
    # Different learning rates really reached the workers: three different losses.
    assert len({r["last_loss"] for r in done["runs"]}) == 3


def test_cancelling_a_sweep_cancels_its_queued_and_running_tasks(
    service: ServiceProcess, slurm_cluster
) -> None:
    client, conf = service.client(), str(slurm_cluster.slurm_conf)
    sweep = client.submit_sweep(
        sweep_spec("sweep-cancel", {"seed": [1, 2, 3]}, max_parallel=1, steps=5000)
    )
    array = queued(client, sweep["id"])["slurm_array_job_id"]
    wait_for(
        "task 0 running", lambda: client.get_sweep(sweep["id"])["runs"][0]["state"] == "RUNNING"
    )
    assert "JobArrayTaskLimit" in slurm("squeue", "-h", "-r", "-j", array, "-o", "%r", conf=conf)

    client.cancel_sweep(sweep["id"])
    wait_for(
        "every run CANCELLED",
        lambda: client.get_sweep(sweep["id"])["counts"] == {"CANCELLED": 3},
        timeout_s=60,
    )
    assert slurm("squeue", "-h", "-r", "-j", array, conf=conf).strip() == ""


def test_a_sweep_run_whose_node_fails_moves_to_a_spare(
    spare_pool: RunyardClient, agents: Agents, slurm_cluster
) -> None:
    """Slurm placed the array task; from then on the run holds its node like any run does."""
    client, conf = spare_pool, str(slurm_cluster.slurm_conf)
    spare = client.get_spares()["members"][0]
    sweep = client.submit_sweep(
        sweep_spec("sweep-xid", {"seed": [1, 2]}, max_parallel=2, steps=200)
    )
    queued(client, sweep["id"])
    victim, other = (r["id"] for r in client.get_sweep(sweep["id"])["runs"])
    first_commit = wait_for("a committed checkpoint", lambda: committed(client, victim))[0]
    wait_for("steps past it", lambda: (client.get_run(victim)["last_step"] or 0) > first_commit)
    run = client.get_run(victim)
    (bad,) = run["nodes"]
    assert run["attempts"][0]["nodes"] == [bad] and spare != bad

    agents.append(bad, XID_79.format(pid=os.getpid()))

    wait_for(f"{bad} drained", lambda: "xid:79" in drain_reason(bad, conf), timeout_s=30)
    second = wait_for(
        "attempt 2 running on the spare",
        lambda: next(
            (a for a in client.get_run(victim)["attempts"][1:] if a["state"] == "RUNNING"), None
        ),
        timeout_s=60,
    )
    assert second["nodes"] == [spare]
    assert "_" not in second["slurm_job_id"]  # a retry is an ordinary submission
    assert second["resume_step"] is not None and second["resume_step"] >= first_commit
    wait_for(
        "both runs to succeed",
        lambda: client.get_sweep(sweep["id"])["state"] == "SUCCEEDED",
        timeout_s=240,
    )
    assert len(client.get_run(other)["attempts"]) == 1
    assert client.get_run(victim)["num_hardware_restarts"] == 1


@contextmanager
def reconciler_paused(service: ServiceProcess) -> Iterator[None]:
    """The API without its reconciler: what the service looks like between two passes."""
    service.stop()
    service.settings["RUNYARD_RUN_RECONCILER"] = "false"
    service.start()
    try:
        yield
    finally:
        service.stop()
        service.settings["RUNYARD_RUN_RECONCILER"] = "true"
        service.start()


def test_a_sweep_down_to_one_member_runs_it_as_a_plain_job(
    service: ServiceProcess, slurm_cluster
) -> None:
    """submitit sends a batch of one as a plain job (no array, no task id): the member
    still gets its token and its job id."""
    client = service.client()
    with reconciler_paused(service):
        grid = {"seed": [1, 2, 3]}
        sweep = client.submit_sweep(sweep_spec("sweep-one", grid, max_parallel=2, steps=20))
        for member in sweep["runs"][1:]:
            client.cancel_run(member["id"])
    survivor = sweep["runs"][0]["id"]
    wait_for(
        "the last member to succeed",
        lambda: client.get_run(survivor)["state"] == "SUCCEEDED",
        timeout_s=180,
    )
    done = client.get_sweep(sweep["id"])
    assert done["counts"] == {"SUCCEEDED": 1, "CANCELLED": 2}
    job = done["slurm_array_job_id"]
    assert "_" not in job and done["runs"][0]["slurm_job_id"] == job
    conf = str(slurm_cluster.slurm_conf)
    assert job_fields(job, conf).get("ArrayJobId") is None  # a plain job, not an array


def test_a_service_that_died_after_sbatch_adopts_the_array_and_keeps_its_tokens(
    service: ServiceProcess, slurm_cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first half of a submission (attempts recorded, tokens minted, sbatch) done by a
    service that then died: the next one adopts the array by name, submits nothing, and
    mints no token (minting would revoke the ones the tasks already run on)."""
    from service.clusters.registry import default_cluster
    from service.config import get_settings
    from service.identity.gate import OwnerGate
    from service.reconcile import sweeps as reconcile_sweeps
    from service.reconcile.submission import mint_worker_token

    client, conf = service.client(), str(slurm_cluster.slurm_conf)
    with reconciler_paused(service):
        grid = {"seed": [1, 2]}
        sweep = client.submit_sweep(sweep_spec("sweep-adopt", grid, max_parallel=2, steps=20))
        for key, value in service.settings.items():
            monkeypatch.setenv(key, value)
        get_settings.cache_clear()
        try:
            settings = get_settings()
            cluster = default_cluster(settings)  # the dev cluster, the sweep's
            prepared = reconcile_sweeps._prepare(settings, cluster.name)
            req = next(r for r in prepared if r.sweep_id == sweep["id"])
            tokens = [
                mint_worker_token(*pair) for pair in zip(req.run_ids, req.attempt_ids, strict=True)
            ]
            array = OwnerGate(settings, cluster).submit_array(req, tokens)  # as its owner
        finally:
            get_settings.cache_clear()
        assert client.get_sweep(sweep["id"])["slurm_array_job_id"] is None  # never recorded
        wait_for(
            "both tasks to start on the tokens minted before the crash",
            lambda: (
                slurm("squeue", "-h", "-r", "-j", array, "-o", "%t", conf=conf).split()
                == ["R", "R"]
            ),
        )
    wait_for(
        "both members to succeed on the adopted array",
        lambda: client.get_sweep(sweep["id"])["state"] == "SUCCEEDED",
        timeout_s=180,
    )
    done = client.get_sweep(sweep["id"])
    assert done["slurm_array_job_id"] == array
    assert [r["slurm_job_id"] for r in done["runs"]] == [f"{array}_0", f"{array}_1"]
    named = slurm("squeue", "-h", "-r", "-t", "all", "-n", req.job_name, "-o", "%F", conf=conf)
    assert set(named.split()) <= {array}, f"a second array was queued: {named}"


def test_an_array_submitted_before_a_crash_is_found_again_by_its_name(
    slurm_cluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What submit_sweeps relies on to never submit a sweep twice."""
    from service.slurm import commands
    from service.slurm.target import SlurmTarget

    conf = str(slurm_cluster.slurm_conf)
    name = f"runyard-adopt-probe-{os.getpid()}"
    array = slurm(
        "sbatch",
        "--parsable",
        "--array=0-2%1",
        "-N1",
        "-t",
        "2",
        "-J",
        name,
        "--output=/dev/null",
        "--wrap",
        "sleep 30",
        conf=conf,
    ).strip()
    try:
        monkeypatch.setenv("SLURM_CONF", conf)
        here = SlurmTarget("")  # the Slurm of SLURM_CONF, as the service's own cluster
        assert commands.array_job_by_name(here, name) == array
        assert commands.array_job_by_name(here, name + "-other") is None
    finally:
        slurm("scancel", array, conf=conf)
