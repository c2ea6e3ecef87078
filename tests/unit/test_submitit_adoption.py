"""A job adopted after a crash between sbatch and submitit's last step can start.

submitit pickles each task under a temporary name, runs sbatch, then renames the pickle to
`<job id>_submitted.pkl`; the job waits 60 s for that file at start and fails without it.
Seen in make test: a service killed mid-recovery left its replacement job so, the new
service adopted it by name, and the job failed a minute later. The adopter now links each
pickle to the name of the job that runs its attempt, without loading it.
"""

from __future__ import annotations

import getpass
import os
import pickle
import uuid
from pathlib import Path

import pytest
from submitit.core.utils import DelayedSubmission, JobPaths
from submitit.helpers import CommandFunction

from service.clusters.registry import default_cluster
from service.config import Settings
from service.identity.gate import OwnerGate
from service.slurm.cli import CliSlurmClient
from service.slurm.owner import RunOwner
from service.slurm.submit import SubmitSettings, finish_interrupted_submission, worker_command


def cut_off_submission(folder: Path, attempt_id: int, python: str = "python3") -> Path:
    """What submitit leaves when its process dies right after sbatch: the temporary pickle,
    written as submitit writes it (timeout set, cloudpickle)."""
    settings = Settings(
        state_dir=folder, accelerator="cpu", run_reconciler=False, worker_python=python
    )
    path = folder / f"{uuid.uuid4().hex}.pkl"
    delayed = DelayedSubmission(
        CommandFunction(worker_command(SubmitSettings.of(settings), attempt_id))
    )
    delayed.set_timeout(60, 3)
    delayed.dump(path)
    return path


def command_in(path: Path) -> list[str]:
    return list(DelayedSubmission.load(path).function.command)


def submitted(folder: Path, job_id: str) -> Path:
    """The file a starting job waits for (submitit's own path)."""
    return JobPaths(folder, job_id=job_id).submitted_pickle


def test_each_pickle_gets_the_name_of_the_job_that_runs_its_attempt(tmp_path: Path) -> None:
    first, second = cut_off_submission(tmp_path, 7), cut_off_submission(tmp_path, 8)
    finished = finish_interrupted_submission(tmp_path, {7: "1201_0", 8: "1201_1"})
    assert sorted(finished) == ["1201_0", "1201_1"]
    assert os.path.samefile(submitted(tmp_path, "1201_0"), first)
    assert os.path.samefile(submitted(tmp_path, "1201_1"), second)
    assert "7" in command_in(submitted(tmp_path, "1201_0"))


def test_a_submitter_still_alive_finishes_its_rename_without_an_error(tmp_path: Path) -> None:
    # A leader that lost its lock mid-submit renames after the new leader linked the file.
    temporary = cut_off_submission(tmp_path, 7)
    finish_interrupted_submission(tmp_path, {7: "1400"})
    temporary.rename(submitted(tmp_path, "1400"))  # what submitit's move does
    assert command_in(submitted(tmp_path, "1400"))[-1] == "7"


def test_of_several_pickles_for_one_attempt_the_newest_is_the_one_sbatch_ran(
    tmp_path: Path,
) -> None:
    stale = cut_off_submission(tmp_path, 7, python="/old/python")  # died before sbatch
    os.utime(stale, (1_000_000, 1_000_000))
    cut_off_submission(tmp_path, 7, python="/new/python")  # the one Slurm queued
    assert finish_interrupted_submission(tmp_path, {7: "1500"}) == ["1500"]
    assert command_in(submitted(tmp_path, "1500"))[0] == "/new/python"


def test_pickles_of_other_attempts_and_finished_jobs_are_left_alone(tmp_path: Path) -> None:
    never_queued = cut_off_submission(tmp_path, 9)  # died before sbatch: no job runs it
    done = submitted(tmp_path, "1300")
    done.write_bytes(b"already renamed by submitit")
    stray = cut_off_submission(tmp_path, 10)
    unreadable = tmp_path / f"{uuid.uuid4().hex}.pkl"
    unreadable.write_bytes(b"cut off mid-write")
    assert finish_interrupted_submission(tmp_path, {10: "1300", 11: "1301"}) == []
    assert done.read_bytes() == b"already renamed by submitit"
    assert never_queued.exists() and stray.exists() and unreadable.exists()
    assert not submitted(tmp_path, "1301").exists()


class _Planted:
    """A pickle a job could write into its own folder: loading it would run os.system."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[str, ...]]:
        return (os.system, (f"touch {self.marker}",))


def test_the_service_reads_a_pickle_without_running_it(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    planted = tmp_path / f"{uuid.uuid4().hex}.pkl"
    planted.write_bytes(pickle.dumps(["--attempt-id", "7", _Planted(marker)]))
    assert finish_interrupted_submission(tmp_path, {7: "1600"}) == ["1600"]
    assert not marker.exists()


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_an_attempt_id_pickled_once_and_fetched_again_is_still_read(
    tmp_path: Path, protocol: int
) -> None:
    seven = "7"  # one object met twice: the second is a fetch from pickle's memo
    temporary = tmp_path / f"{uuid.uuid4().hex}.pkl"
    temporary.write_bytes(
        pickle.dumps([{"a": [seven]}, ["python3", "--attempt-id", seven]], protocol=protocol)
    )
    assert finish_interrupted_submission(tmp_path, {7: "1700"}) == ["1700"]


def test_the_real_slurm_client_finishes_an_adopted_submission(tmp_path: Path) -> None:
    temporary = cut_off_submission(tmp_path, 21)
    settings = Settings(state_dir=tmp_path, accelerator="cpu", run_reconciler=False)
    # As the owner: here the caller itself, so the owner's program runs without sudo.
    owner = RunOwner(unix_user=getpass.getuser(), slurm_account="ops")
    cluster = default_cluster(settings)
    client = CliSlurmClient(settings, OwnerGate(settings, cluster), cluster)
    client.finish_submission(owner, tmp_path, {21: "1800"})
    assert os.path.samefile(submitted(tmp_path, "1800"), temporary)
