"""The in-memory Slurm behaves as the real one does where the reconciler's decisions depend
on it: exclusive nodes, drains, reservations, arrays, what squeue and scontrol print."""

from __future__ import annotations

import inspect
import time
from dataclasses import replace
from pathlib import Path

import pytest

from service.slurm import commands
from service.slurm.cli import CliSlurmClient
from service.slurm.client import SlurmClient
from service.slurm.commands import SlurmError
from service.slurm.fake import CANCELLED_EXIT, FakeSlurm
from service.slurm.owner import RunOwner
from service.slurm.snapshot import ClusterSnapshot, take_snapshot
from service.slurm.submit import ArrayRequest, AttemptRequest
from service.slurm.target import SlurmTarget

# The Slurm the environment reaches, as the commands' tests have always run them.
LOCAL = SlurmTarget("")


def attempt(name: str, nodes: list[str], reservation: str | None = None) -> AttemptRequest:
    return AttemptRequest(
        run_id=1,
        attempt_id=1,
        job_name=name,
        job_folder=Path("/nonexistent"),
        num_nodes=len(nodes),
        ranks_per_node=8,
        time_limit_min=60,
        nodelist=",".join(nodes),
        reservation=reservation,
    )


def array(name: str, num_tasks: int, max_parallel: int) -> ArrayRequest:
    return ArrayRequest(
        sweep_id=1,
        attempt_ids=tuple(range(10, 10 + num_tasks)),
        run_ids=tuple(range(1, 1 + num_tasks)),
        job_name=name,
        job_folder=Path("/nonexistent"),
        num_nodes=1,
        ranks_per_node=8,
        time_limit_min=60,
        max_parallel=max_parallel,
    )


def protocol_methods() -> list[str]:
    """The methods SlurmClient declares: what the reconciler may call on either client."""
    return [
        name
        for name, member in vars(SlurmClient).items()
        if inspect.isfunction(member) and not name.startswith("_")
    ]


@pytest.mark.parametrize("implementation", [FakeSlurm, CliSlurmClient], ids=lambda c: c.__name__)
def test_each_client_has_the_protocols_signatures(implementation: type) -> None:
    """Parameter names, kinds, defaults and annotations (resolved to types) and the return
    type of every protocol method, so a decision tested on the fake is one the real client
    can be asked for in the same words. mypy checks the same where a client is used as a
    SlurmClient; this holds for every method, used or not."""
    assert len(protocol_methods()) >= 18  # the protocol was read, not an empty class
    for name in protocol_methods():
        assert callable(getattr(implementation, name, None)), f"{implementation.__name__}.{name}"
        declared = inspect.signature(getattr(SlurmClient, name), eval_str=True)
        defined = inspect.signature(getattr(implementation, name), eval_str=True)
        assert list(defined.parameters) == list(declared.parameters), name
        for param in declared.parameters.values():
            assert defined.parameters[param.name] == param, (name, param.name)
        assert defined.return_annotation == declared.return_annotation, name


def test_a_job_runs_on_its_nodes_exclusively_and_prints_like_squeue() -> None:
    slurm = FakeSlurm.cluster(num_switches=2, nodes_per_switch=2)
    first = slurm.submit(attempt("a", ["gpu001", "gpu002"]), "token")
    second = slurm.submit(attempt("b", ["gpu002", "gpu003"]), "token")
    assert slurm.schedule() == [first]
    queue = slurm.queue([first, second])
    assert queue[first].state == "RUNNING" and queue[first].node_list == "gpu[001-002]"
    assert queue[second].state == "PENDING" and queue[second].node_list == ""
    assert queue[second].reason == "Resources"
    states = {n.name: n.state for n in slurm.show_nodes()}
    assert states == {
        "gpu001": "ALLOCATED",
        "gpu002": "ALLOCATED",
        "gpu003": "IDLE",
        "gpu004": "IDLE",
    }
    slurm.finish(first, exit_code=0)
    assert slurm.queue([first]) == {}
    assert slurm.job_details([first])[first].state == "COMPLETED"
    assert slurm.schedule() == [second]


def test_a_drained_node_keeps_its_job_and_takes_no_new_one() -> None:
    slurm = FakeSlurm.cluster(num_switches=1, nodes_per_switch=2)
    job = slurm.submit(attempt("a", ["gpu001"]), "token")
    slurm.schedule()
    slurm.drain("gpu001", "xid 79")
    node = next(n for n in slurm.show_nodes() if n.name == "gpu001")
    assert node.state == "ALLOCATED+DRAIN" and node.reason == "runyard: xid 79"
    assert slurm.queue([job])[job].state == "RUNNING"
    slurm.cancel({job: ""})  # as the user it runs as (attempt() names none)
    assert slurm.job_details([job])[job].exit_code == CANCELLED_EXIT
    again = slurm.submit(attempt("b", ["gpu001"]), "token")
    assert slurm.schedule() == []
    slurm.resume("gpu001")
    assert slurm.schedule() == [again]


def test_reservations_keep_other_jobs_off_and_their_own_jobs_in() -> None:
    slurm = FakeSlurm.cluster(num_switches=1, nodes_per_switch=3)
    slurm.create_reservation("runyard-run1", ["gpu001", "gpu002"])
    outside = slurm.submit(attempt("other", ["gpu002"]), "token")
    inside = slurm.submit(
        attempt("ours", ["gpu001", "gpu002"], reservation="runyard-run1"), "token"
    )
    assert slurm.schedule() == [inside]
    assert slurm.job_details([outside])[outside].state == "PENDING"
    with pytest.raises(SlurmError, match="reservation is invalid"):
        slurm.submit(attempt("x", ["gpu001"], reservation="runyard-run9"), "token")
    with pytest.raises(SlurmError, match="node configuration is not available"):
        slurm.submit(attempt("x", ["gpu003"], reservation="runyard-run1"), "token")
    with pytest.raises(SlurmError, match="Invalid node name"):
        slurm.submit(attempt("x", ["gpu999"]), "token")


def test_a_node_failure_ends_its_job_node_fail_and_leaves_the_node_down() -> None:
    slurm = FakeSlurm.cluster(num_switches=1, nodes_per_switch=2)
    job = slurm.submit(attempt("a", ["gpu001", "gpu002"]), "token")
    slurm.schedule()
    slurm.fail_node("gpu002")
    assert slurm.job_details([job])[job].state == "NODE_FAIL"
    snapshot = take_snapshot(slurm)
    assert snapshot.nodes["gpu002"].state == "DOWN*"
    assert snapshot.is_free("gpu001") and not snapshot.is_usable("gpu002")


def test_an_array_runs_at_most_max_parallel_tasks_and_is_found_by_name() -> None:
    slurm = FakeSlurm.cluster(num_switches=1, nodes_per_switch=4)
    array_id = slurm.submit_array(array("runyard-s1", num_tasks=3, max_parallel=2), [])
    assert slurm.schedule() == [f"{array_id}_0", f"{array_id}_1"]
    assert slurm.array_job_by_name("runyard-s1") == array_id
    assert slurm.array_job_by_name("runyard-s2") is None
    slurm.finish(f"{array_id}_0")
    assert slurm.schedule() == [f"{array_id}_2"]
    one = slurm.submit_array(array("runyard-s2", num_tasks=1, max_parallel=1), [])
    assert one in slurm.jobs and slurm.array_job_by_name("runyard-s2") == one


def test_a_cancel_leaves_alone_the_jobs_of_another_user_than_the_one_named() -> None:
    """SlurmClient.cancel names whom each job must run as, as `scancel --user` does: bob's
    job (and the tasks of bob's array) survive a cancel asked for as alice's."""
    slurm = FakeSlurm.cluster(num_switches=1, nodes_per_switch=3)
    bobs = slurm.run_foreign_job("bobs-own", ["gpu001"], user="bob")
    alices = slurm.run_foreign_job("alices-own", ["gpu002"], user="alice")
    slurm.cancel({bobs: "alice", alices: "alice"})
    assert (slurm.jobs[bobs].state, slurm.jobs[alices].state) == ("RUNNING", "CANCELLED")
    slurm.cancel({bobs: "bob"})
    assert slurm.jobs[bobs].state == "CANCELLED"
    bob = RunOwner(unix_user="bob", slurm_account="speech")
    array_id = slurm.submit_array(replace(array("bobs-sweep", 2, 2), owner=bob), [])
    slurm.cancel({array_id: "alice", f"{array_id}_1": "alice"})
    assert {slurm.jobs[f"{array_id}_{t}"].state for t in range(2)} == {"PENDING"}


def test_the_cli_client_scancels_once_per_owner_with_their_user(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`scancel --user=<owner> -- <ids>`: scancel leaves a job of anyone else alone (seen on
    22.05.8: bob's job survived `scancel --user=alice -- <its id>`). A run accepted before
    runs had owners (no Unix user) was submitted as the service itself."""
    ran: list[list[str]] = []

    def run_slurm(target: SlurmTarget, argv: list[str], check: bool = True) -> str:
        ran.append(argv)
        return ""

    monkeypatch.setattr(commands, "run_slurm", run_slurm)
    client = CliSlurmClient.__new__(CliSlurmClient)
    client.user, client.target = "runyard", LOCAL
    client.cancel({"11": "alice", "12": "bob", "13": "alice", "14": ""})
    assert ran == [
        ["scancel", "--user=alice", "--", "11", "13"],
        ["scancel", "--user=bob", "--", "12"],
        ["scancel", "--user=runyard", "--", "14"],
    ]
    ran.clear()
    client.cancel({})
    assert ran == []  # never `scancel --user=x` alone: that cancels every job of x's
    for user in ("", "--all"):
        with pytest.raises(ValueError, match="Unix user"):
            commands.scancel(LOCAL, user, ["11"])


def test_forgotten_jobs_and_outages() -> None:
    slurm = FakeSlurm.cluster(num_switches=1, nodes_per_switch=1)
    job = slurm.submit(attempt("runyard-r1-a1", ["gpu001"]), "token")
    assert slurm.jobs_by_name("runyard-") == {"runyard-r1-a1": job}
    slurm.finish(job, exit_code=3)
    assert slurm.jobs_by_name("runyard-") == {"runyard-r1-a1": job}  # ended, remembered
    slurm.forget(job)
    assert slurm.job_details([job]) == {} and slurm.jobs_by_name("runyard-") == {}
    slurm.break_call("jobs_by_name")
    with pytest.raises(SlurmError, match="not responding"):
        slurm.jobs_by_name("runyard-")
    assert slurm.calls["jobs_by_name"] == 4 and slurm.calls["job_details"] == 1


def test_a_full_size_cluster_schedules_ten_thousand_jobs_fast() -> None:
    """1,280 nodes and 10,000 queued jobs: one schedule pass and one queue read stay cheap,
    so a simulation can run many ticks."""
    slurm = FakeSlurm.cluster(num_switches=40, nodes_per_switch=32)
    jobs = [
        slurm.submit(
            attempt(f"j{i}", [f"gpu{(i * 4) % 1280 + k + 1:04d}" for k in range(4)]), "token"
        )
        for i in range(10_000)
    ]
    started_at = time.perf_counter()
    started = slurm.schedule()
    queue = slurm.queue(jobs)
    elapsed = time.perf_counter() - started_at
    assert len(started) == 320 and len(queue) == 10_000
    assert elapsed < 1.0, f"schedule + queue took {elapsed:.2f} s"


def test_snapshot_reads_the_cluster_in_two_calls() -> None:
    slurm = FakeSlurm.cluster(num_switches=1, nodes_per_switch=2)
    slurm.create_reservation("runyard-spares", ["gpu002"])
    snapshot = take_snapshot(slurm)
    assert isinstance(snapshot, ClusterSnapshot)
    assert snapshot.reservations == {"runyard-spares": ["gpu002"]}
    assert not snapshot.is_free("gpu002") and snapshot.is_free("gpu001")
    assert slurm.calls["show_nodes"] == 1 and slurm.calls["reservations"] == 1
