"""Parsing what Slurm 22.05 prints (lines captured from the dev cluster)."""

from __future__ import annotations

from service.slurm.commands import parse_exit_code, parse_gpus, parse_key_values

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
