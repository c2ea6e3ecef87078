"""Every Slurm command runyard runs, read from what real clusters printed: Debian 12's
Slurm 22.05 and Slurm 24.11, each recorded into tests/fixtures/slurm_outputs/<release> by
scripts/record_slurm_outputs.py (jobs completed, failed, cancelled, running, pending, an
array held back by its limit, a reservation, a drained node).

The adapters run as in the service, only `subprocess.run` answers from the recording: a
command it was not recorded with fails the test (record again after changing a command).
Each query is checked in the form runyard takes on the release (queries.py), in its text
form, and in its JSON form where the release has a complete one (24.05.1+, taken or not:
contract/slurm_features.py), so either reader can take over.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from submitit.slurm.slurm import SlurmExecutor

from client.doctor import slurm as doctor
from client.doctor.result import SiteSettings, Status
from contract.slurm_features import SlurmFeature, SlurmVersion
from service.slurm import accounting, commands, json_output, queries, version
from service.slurm.hostlist import compress_hostlist
from service.slurm.target import SlurmTarget
from service.slurm.topology import TopologyKind, parse_topology
from worker.launch import parse_node_addr

# The Slurm the environment reaches, as the commands' tests have always run them.
LOCAL = SlurmTarget("")

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "slurm_outputs"
RELEASES = sorted(p.name for p in FIXTURES.iterdir() if (p / "manifest.json").exists())


@dataclass
class Recording:
    """One release's recorded outputs, answering subprocess.run by argv."""

    folder: Path
    manifest: dict[str, Any]
    ran: list[list[str]]

    @property
    def jobs(self) -> dict[str, str]:
        return self.manifest["jobs"]

    @property
    def release(self) -> str:
        return self.folder.name

    def text(self, name: str) -> str:
        return (self.folder / name).read_text()

    def answer(self, argv: list[str], *_: Any, **__: Any) -> subprocess.CompletedProcess[str]:
        key = [Path(argv[0]).name, *argv[1:]]
        self.ran.append(key)
        for name, recorded in self.manifest["outputs"].items():
            if recorded == key:
                stderr_file = self.folder / f"{name}.stderr"
                rc, stderr = 0, ""
                if stderr_file.exists():
                    first, _, stderr = stderr_file.read_text().partition("\n")
                    rc = int(first.split()[1])
                return subprocess.CompletedProcess(argv, rc, self.text(name), stderr)
        raise AssertionError(f"{key} was not recorded for {self.release}: record again")


@pytest.fixture(params=RELEASES)
def recorded(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Recording]:
    folder = FIXTURES / request.param
    rec = Recording(folder, json.loads((folder / "manifest.json").read_text()), [])
    monkeypatch.setattr(subprocess, "run", rec.answer)
    version.forget()
    yield rec
    version.forget()


def all_ids(rec: Recording) -> list[str]:
    """The ids in the order the recorder asked squeue for them."""
    named = [rec.jobs[k] for k in ("completed", "failed", "cancelled", "running", "pending")]
    return named + [f"{rec.jobs['array']}_{t}" for t in range(3)]


def has_json(feature: SlurmFeature) -> bool:
    """The release has a complete JSON form of this query, whether runyard takes it or not."""
    return feature in queries.release().available


def test_the_version_is_read_and_names_its_features(recorded: Recording) -> None:
    release = queries.release()
    assert release.version.release == recorded.release
    assert SlurmVersion.parse(recorded.text("scontrol_version.txt")) == release.version
    # 22.05 has no JSON runyard could use; 24.11 has it complete for every job and node
    # query, and runyard does not take it (slower: NOT_TAKEN), nor any for 22.05.
    json_queries = {SlurmFeature.SQUEUE_JSON, SlurmFeature.SCONTROL_JSON, SlurmFeature.SACCT_JSON}
    assert (json_queries <= release.available) == (release.version >= SlurmVersion(24, 5))
    assert not json_queries & release.features
    block = {SlurmFeature.TOPOLOGY_BLOCK, SlurmFeature.SEGMENT}
    assert (block <= release.features) == (release.version >= SlurmVersion(24, 5))


def check_live_jobs(rec: Recording, found: dict[str, commands.JobStatus]) -> None:
    jobs, array = rec.jobs, rec.jobs["array"]
    running = found[jobs["running"]]
    assert running.state == "RUNNING" and running.is_live
    assert running.node_list == compress_hostlist(rec.manifest["nodes"][:2])
    assert found[jobs["pending"]].state == "PENDING"
    assert found[jobs["pending"]].reason == "Resources"
    assert found[f"{array}_0"].state == "RUNNING"
    for task in (f"{array}_1", f"{array}_2"):  # held back by the array's %1
        assert found[task].state == "PENDING" and found[task].reason == "JobArrayTaskLimit"
    for ended in ("completed", "failed", "cancelled"):
        assert jobs[ended] not in found or not found[jobs[ended]].is_live


def test_squeue_lists_the_live_jobs_and_each_array_task(recorded: Recording) -> None:
    check_live_jobs(recorded, queries.squeue(LOCAL, all_ids(recorded)))
    check_live_jobs(recorded, commands.squeue(LOCAL, all_ids(recorded)))
    if has_json(SlurmFeature.SQUEUE_JSON):  # one record for the pending tasks, expanded
        check_live_jobs(recorded, queries.squeue_json(LOCAL, all_ids(recorded)))


def test_jobs_are_found_by_name_and_arrays_by_theirs(recorded: Recording) -> None:
    jobs = recorded.jobs
    forms = [
        (queries.jobs_by_name, queries.array_job_by_name),
        (commands.jobs_by_name, commands.array_job_by_name),
    ]
    if has_json(SlurmFeature.SQUEUE_JSON):
        forms.append((queries.jobs_by_name_json, queries.array_job_by_name_json))
    for by_name, array_by_name in forms:
        named = by_name(LOCAL, "runyard-record-")
        assert named["runyard-record-ok"] == jobs["completed"]
        assert named["runyard-record-fail"] == jobs["failed"]
        assert named["runyard-record-cancel"] == jobs["cancelled"]
        assert named["runyard-record-run"] == jobs["running"]
        assert named["runyard-record-wait"] == jobs["pending"]
        assert array_by_name(LOCAL, "runyard-record-array") == jobs["array"]


def check_job_details(rec: Recording, found: dict[str, commands.JobStatus]) -> None:
    jobs = rec.jobs
    assert (found[jobs["completed"]].state, found[jobs["completed"]].exit_code) == ("COMPLETED", 0)
    assert (found[jobs["failed"]].state, found[jobs["failed"]].exit_code) == ("FAILED", 3)
    # scancel sends SIGTERM: a shell's 128 + 15.
    assert (found[jobs["cancelled"]].state, found[jobs["cancelled"]].exit_code) == (
        "CANCELLED",
        143,
    )
    assert found[jobs["running"]].state == "RUNNING"
    assert found[jobs["pending"]].state == "PENDING" and found[jobs["pending"]].node_list == ""
    assert found[f"{jobs['array']}_0"].state == "RUNNING"
    # Whose and which: a submission's answer is checked against both (submission.py).
    running, task = found[jobs["running"]], found[f"{jobs['array']}_0"]
    assert (running.user, running.name) == ("root", "runyard-record-run")
    assert (task.user, task.name) == ("root", "runyard-record-array")


def test_scontrol_show_job_gives_final_states_and_exit_codes(recorded: Recording) -> None:
    ids = all_ids(recorded)
    failed = recorded.jobs["failed"]
    forms = [queries.show_jobs, commands.show_jobs]
    if has_json(SlurmFeature.SCONTROL_JSON):
        forms.append(queries.show_jobs_json)
    for show_jobs in forms:
        check_job_details(recorded, show_jobs(LOCAL, ids))
        assert show_jobs(LOCAL, [failed])[failed].exit_code == 3  # asked by id


def test_forgotten_jobs_are_an_answer_not_an_outage(recorded: Recording) -> None:
    assert queries.squeue(LOCAL, ["999999"]) == {}
    assert queries.show_jobs(LOCAL, ["999999"]) == {}
    assert commands.squeue(LOCAL, ["999999"]) == {}
    assert commands.show_jobs(LOCAL, ["999999"]) == {}
    if has_json(SlurmFeature.SQUEUE_JSON):
        assert queries.squeue_json(LOCAL, ["999999"]) == {}
        assert queries.show_jobs_json(LOCAL, ["999999"]) == {}


def check_nodes(rec: Recording, nodes: list[commands.SlurmNode]) -> None:
    by_name = {n.name: n for n in nodes}
    drained = by_name[rec.manifest["drained"]]
    assert "DRAIN" in drained.state.split("+")
    assert drained.reason.startswith("runyard: Xid 79 on GPU 3")
    for name in rec.manifest["nodes"][:2]:
        assert by_name[name].state.split("+")[0] == "ALLOCATED"
    assert all(n.num_gpus == 8 and n.addr == "127.0.0.1" for n in nodes)


def test_scontrol_show_node_gives_states_drain_reasons_and_gpus(recorded: Recording) -> None:
    check_nodes(recorded, queries.show_nodes(LOCAL))
    check_nodes(recorded, commands.show_nodes(LOCAL))
    if has_json(SlurmFeature.SCONTROL_JSON):
        check_nodes(recorded, queries.show_nodes_json(LOCAL))
    one = recorded.text("scontrol_show_one_node.txt")
    assert parse_node_addr(one) == "127.0.0.1"  # what each worker asks of its node


def test_reservations_list_their_nodes(recorded: Recording) -> None:
    reserved = recorded.manifest["nodes"][-2]
    name = recorded.manifest["reservation"]
    assert queries.show_reservations(LOCAL)[name] == [reserved]
    assert commands.show_reservations(LOCAL)[name] == [reserved]
    if has_json(SlurmFeature.SCONTROL_JSON):
        assert queries.show_reservations_json(LOCAL)[name] == [reserved]
    duplicate = recorded.text("scontrol_create_duplicate_reservation.txt.stderr")
    assert "Duplicate reservation name" in duplicate  # create_reservation updates instead


def check_ended(rec: Recording, found: dict[str, commands.JobStatus]) -> None:
    jobs = rec.jobs
    assert (found[jobs["completed"]].state, found[jobs["completed"]].exit_code) == ("COMPLETED", 0)
    assert (found[jobs["failed"]].state, found[jobs["failed"]].exit_code) == ("FAILED", 3)
    assert found[jobs["cancelled"]].state == "CANCELLED"


def test_sacct_gives_how_forgotten_jobs_ended(recorded: Recording) -> None:
    ended = [recorded.jobs[k] for k in ("completed", "failed", "cancelled")]
    check_ended(recorded, queries.ended_jobs(LOCAL, ended))
    check_ended(recorded, accounting.ended_jobs(LOCAL, ended))
    if has_json(SlurmFeature.SACCT_JSON):
        check_ended(recorded, queries.ended_jobs_json(LOCAL, ended))


def test_the_topology_gives_each_node_its_group(recorded: Recording) -> None:
    topology = parse_topology(recorded.text("scontrol_show_topology.txt"))
    assert commands.show_topology(LOCAL) == topology
    nodes = {n.name for n in queries.show_nodes(LOCAL)}
    assert set(topology.group_of) == nodes
    plugin = doctor.show_config(SiteSettings.load(None))["TopologyPlugin"]
    assert plugin == f"topology/{topology.kind.value}"
    if topology.kind is TopologyKind.BLOCK:
        assert topology.block_size and len(set(topology.group_of.values())) > 1
        assert all(g.startswith("block") for g in topology.group_of.values())
    else:
        assert topology.kind is TopologyKind.TREE and topology.block_size is None


def test_the_doctor_reads_the_controller_version_config_and_gres(recorded: Recording) -> None:
    settings = SiteSettings.load(None)
    assert doctor.controller(settings).status is Status.OK
    version_check = doctor.version(settings)
    assert version_check.status is Status.OK and recorded.release in version_check.detail
    config = doctor.show_config(settings)
    assert doctor.gres(settings, config).status is Status.OK
    assert doctor.topology(settings, config).status is Status.OK
    assert doctor.accounting(config).status is Status.OK  # both clusters keep accounting


def test_sbatch_answers_with_the_job_id_submitit_reads(recorded: Recording) -> None:
    out = recorded.text("sbatch_submitted.txt")
    job_id = SlurmExecutor._get_job_id_from_submission_command(out)
    assert job_id.isdigit() and out.strip() == f"Submitted batch job {job_id}"


def test_a_job_state_in_flags_reads_as_squeue_prints_it() -> None:
    """24.05+ prints a job's state as its base state and flags; the text forms print one
    word, a flag when one is set (job_state_string)."""
    assert json_output.job_state_text(["RUNNING"]) == "RUNNING"
    assert json_output.job_state_text(["COMPLETED", "COMPLETING"]) == "COMPLETING"
    assert json_output.job_state_text(["PENDING", "REQUEUED"]) == "REQUEUED"
    assert json_output.job_state_text([]) == "UNKNOWN"
    killed = {"status": ["SIGNALED"], "return_code": {"set": True, "number": 0},
              "signal": {"id": {"set": True, "number": 9}}}  # fmt: skip
    assert json_output.exit_code(killed) == 137
    assert json_output.array_tasks("1-2") == [1, 2]
    assert json_output.array_tasks("0,4-8:2%1") == [0, 4, 6, 8]
