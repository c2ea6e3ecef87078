"""Parsing what Slurm 22.05 prints (lines captured from the dev cluster)."""

from __future__ import annotations

from typing import Any

import pytest

from service.slurm.commands import parse_exit_code, parse_gpus, parse_key_values
from service.slurm.target import SlurmTarget

# The Slurm the environment reaches, as the commands' tests have always run them.
LOCAL = SlurmTarget("")

JOB_LINE = (
    "JobId=6 JobName=runyard-runyard-r2-a3 UserId=root(0) GroupId=root(0) Priority=1 "
    "JobState=FAILED Reason=NonZeroExitCode Dependency=(null) Requeue=1 Restarts=0 "
    "ExitCode=1:0 RunTime=00:00:12 NodeList=gpu[001-002] BatchHost=gpu001 NumNodes=2"
)


def test_key_values_of_a_job_line() -> None:
    fields = parse_key_values(JOB_LINE)
    assert fields["JobState"] == "FAILED"
    assert fields["NodeList"] == "gpu[001-002]"
    assert fields["ExitCode"] == "1:0"


def test_exit_codes() -> None:
    assert parse_exit_code("0:0") == 0
    assert parse_exit_code("3:0") == 3
    assert parse_exit_code("0:9") == 137  # killed by SIGKILL, as a shell reports it
    assert parse_exit_code("") is None


def test_gres_gpu_counts() -> None:
    assert parse_gpus("gpu:8") == 8
    assert parse_gpus("gpu:h100:8(S:0-1)") == 8
    assert parse_gpus("(null)") == 0
    assert parse_gpus("gpu:4,gpu:a100:2") == 6


def test_a_sweep_is_one_sbatch_array_with_its_limit_and_per_task_tokens(tmp_path) -> None:
    """What submitit writes for our array request: `--array=0-2%2`, and a token per task."""
    from dataclasses import replace

    from submitit.slurm.slurm import _make_sbatch_string

    from service.config import get_settings
    from service.slurm.owner import RunOwner
    from service.slurm.submit import ArrayRequest, SubmitSettings, sbatch_parameters

    req = ArrayRequest(
        sweep_id=7,
        attempt_ids=(11, 12, 13),
        run_ids=(1, 2, 3),
        job_name="runyard-x-s7",
        job_folder=tmp_path / "sweep-000007",
        num_nodes=1,
        ranks_per_node=1,
        time_limit_min=30,
        max_parallel=2,
        owner=RunOwner(unix_user="alice", slurm_account="vision", qos="high"),
    )
    params = sbatch_parameters(req, SubmitSettings.of(get_settings()))
    assert "nodelist" not in params and "reservation" not in params["additional_parameters"]
    script = _make_sbatch_string(command="true", folder=req.job_folder, map_count=3, **params)
    assert "#SBATCH --array=0-2%2" in script
    # Charged to the owner's account and QoS; the job's files get the run's umask first.
    assert "#SBATCH --account=vision" in script and "#SBATCH --qos=high" in script
    assert script.index("umask 0027") < script.index("RUNYARD_TOKEN")
    assert f"#SBATCH --output={req.job_folder}/%A_%a_0_log.out" in script
    tokens = req.job_folder / "tokens"
    assert f'export RUNYARD_TOKEN="$(cat {tokens}/"${{SLURM_ARRAY_TASK_ID:-0}}".token)"' in script
    assert req.token_file(2) == tokens / "2.token"
    assert req.task_job_id("40", 2) == "40_2"
    # submitit sends a batch of one as a plain job: no task id, and the job id is the array's.
    alone = replace(req, attempt_ids=(11,), run_ids=(1,))
    assert alone.task_job_id("41", 0) == "41" and alone.token_file(0) == tokens / "0.token"
    assert "--switches" not in script  # one node per task: nothing to keep together
    wide = sbatch_parameters(replace(req, num_nodes=4), SubmitSettings.of(get_settings()))
    assert wide["additional_parameters"]["switches"] == "1@05:00"


def test_scontrol_job_records_answer_to_their_id_and_their_array_task_id() -> None:
    """`scontrol show job -o` lists array tasks by their own JobId; the reconciler stores
    `<array>_<task>`, so a record answers to both."""
    from service.slurm.commands import parse_jobs

    out = "\n".join(
        [
            JOB_LINE,
            "JobId=9 ArrayJobId=7 ArrayTaskId=2 JobName=s JobState=COMPLETED Reason=None "
            "ExitCode=0:0 NodeList=gpu003",
            "JobId=7 ArrayJobId=7 ArrayTaskId=3-5%2 JobName=s JobState=PENDING "
            "Reason=JobArrayTaskLimit ExitCode=0:0 NodeList=(null)",
        ]
    )
    jobs = parse_jobs(out, ["6", "7_2", "7_3", "8"])
    assert sorted(jobs) == ["6", "7_2"]
    assert jobs["6"].state == "FAILED" and jobs["6"].exit_code == 1
    assert jobs["6"].node_list == "gpu[001-002]"
    assert jobs["7_2"].state == "COMPLETED" and jobs["7_2"].exit_code == 0
    assert parse_jobs(out, ["7"])["7"].node_list == ""  # (null) while pending


def test_forgotten_jobs_are_an_answer_and_an_outage_is_an_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """squeue exits 1 both for job ids slurmctld forgot and when it does not answer; only
    the first may read as "no such jobs" (the second would fail every running attempt)."""
    import subprocess

    from service.slurm import commands

    def slurm_says(stderr: str) -> None:
        done = subprocess.CompletedProcess(["squeue"], 1, stdout="", stderr=stderr)
        monkeypatch.setattr(commands, "_run", lambda target, argv: done)

    slurm_says("slurm_load_jobs error: Invalid job id specified\n")
    assert commands.squeue(LOCAL, ["999999"]) == {}
    assert commands.show_jobs(LOCAL, ["999999"]) == {}
    slurm_says("slurm_load_jobs error: Unable to contact slurm controller (connect failure)\n")
    with pytest.raises(commands.SlurmError, match="Unable to contact"):
        commands.squeue(LOCAL, ["42"])
    with pytest.raises(commands.SlurmError, match="Unable to contact"):
        commands.show_jobs(LOCAL, ["42", "43"])


def test_no_answer_from_slurmctld_is_told_apart_from_a_refusal() -> None:
    from service.slurm.commands import SlurmError, SlurmUnreachable, slurm_error

    no_answer = [
        "sbatch: error: Batch job submission failed: Socket timed out on send/recv operation",
        "sbatch: error: Batch job submission failed: Unable to contact slurm controller "
        "(connect failure)",
        "scontrol: error: Zero Bytes were transmitted or received",
    ]
    for message in no_answer:
        assert isinstance(slurm_error(message), SlurmUnreachable), message
    refusal = slurm_error("sbatch: error: Batch job submission failed: Invalid account")
    assert type(refusal) is SlurmError


def test_a_slurm_command_that_outlives_its_timeout_is_no_answer(monkeypatch: Any) -> None:
    import subprocess

    from service.slurm import commands

    def hangs(*args: Any, **kwargs: Any) -> None:
        raise subprocess.TimeoutExpired(cmd="scontrol", timeout=commands.TIMEOUT_S)

    monkeypatch.setattr(commands.subprocess, "run", hangs)
    with pytest.raises(commands.SlurmUnreachable):
        commands.run_slurm(LOCAL, ["scontrol", "ping"])
