"""Reading how jobs ended from sacct's output (service/slurm/accounting.py)."""

from __future__ import annotations

from service.slurm.accounting import parse_sacct

OUT = """\
101|COMPLETED|gpu[001-002]|0:0|None
102|CANCELLED by 0|gpu003|0:15|None
103|FAILED|gpu004|3:0|NonZeroExitCode
104|RUNNING|gpu005|0:0|None
105|PENDING|None assigned|0:0|Resources
999|COMPLETED|gpu001|0:0|None
"""


def test_ended_jobs_are_read_with_their_exit_codes() -> None:
    jobs = parse_sacct(OUT, ["101", "102", "103", "104", "105"])
    assert sorted(jobs) == ["101", "102", "103"], "live jobs and others' jobs are left out"
    assert (jobs["101"].state, jobs["101"].exit_code, jobs["101"].node_list) == (
        "COMPLETED",
        0,
        "gpu[001-002]",
    )
    assert (jobs["102"].state, jobs["102"].exit_code) == ("CANCELLED", 128 + 15)
    assert (jobs["103"].state, jobs["103"].exit_code, jobs["103"].reason) == (
        "FAILED",
        3,
        "NonZeroExitCode",
    )


def test_a_requeued_job_counts_by_its_last_record() -> None:
    out = "7|NODE_FAIL|gpu001|0:0|None\n7|PENDING|None assigned|0:0|BeginTime\n"
    assert parse_sacct(out, ["7"]) == {}
    out += "7|COMPLETED|gpu002|0:0|None\n"
    assert parse_sacct(out, ["7"])["7"].state == "COMPLETED"


def test_no_accounting_means_no_answer() -> None:
    assert parse_sacct("", ["1"]) == {}
