"""A job adopted after a crash between sbatch and submitit's last step can start.

submitit pickles each task under a temporary name, runs sbatch, then renames the pickle to
`<job id>_submitted.pkl`; the job waits 60 s for that file at start and fails without it.
Seen in make test: a service killed mid-recovery left its replacement job so, the new
service adopted it by name, and the job failed a minute later. The adopter renames the
pickles itself, each to the job that runs its attempt.
"""

from __future__ import annotations

import uuid
from pathlib import Path

from submitit.core.utils import DelayedSubmission, JobPaths
from submitit.helpers import CommandFunction

from service.config import Settings
from service.slurm.submit import finish_interrupted_submission, worker_command


def cut_off_submission(folder: Path, attempt_id: int) -> Path:
    """What submitit leaves when its process dies right after sbatch: the temporary pickle."""
    settings = Settings(state_dir=folder, accelerator="cpu", run_reconciler=False)
    pickle = folder / f"{uuid.uuid4().hex}.pkl"
    DelayedSubmission(CommandFunction(worker_command(settings, attempt_id))).dump(pickle)
    return pickle


def attempt_in(pickle: Path) -> int:
    command = DelayedSubmission.load(pickle).function.command
    return int(command[command.index("--attempt-id") + 1])


def test_each_pickle_gets_the_name_of_the_job_that_runs_its_attempt(tmp_path: Path) -> None:
    first, second = cut_off_submission(tmp_path, 7), cut_off_submission(tmp_path, 8)
    finished = finish_interrupted_submission(tmp_path, {7: "1201_0", 8: "1201_1"})
    assert sorted(finished) == ["1201_0", "1201_1"]
    for attempt, job_id in ((7, "1201_0"), (8, "1201_1")):
        submitted = JobPaths(tmp_path, job_id=job_id).submitted_pickle  # what the job reads
        assert submitted.exists() and attempt_in(submitted) == attempt
    assert not first.exists() and not second.exists()


def test_pickles_of_other_attempts_and_finished_jobs_are_left_alone(tmp_path: Path) -> None:
    never_queued = cut_off_submission(tmp_path, 9)  # died before sbatch: no job runs it
    done = JobPaths(tmp_path, job_id="1300").submitted_pickle
    done.write_bytes(b"already renamed by submitit")
    stray = cut_off_submission(tmp_path, 10)
    unreadable = tmp_path / f"{uuid.uuid4().hex}.pkl"
    unreadable.write_bytes(b"cut off mid-write")
    assert finish_interrupted_submission(tmp_path, {10: "1300"}) == []
    assert done.read_bytes() == b"already renamed by submitit"
    assert never_queued.exists() and stray.exists() and unreadable.exists()
