"""GET /v1/runs/{id}/logs and `runyard run logs` on real files and a real Postgres."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from client.api import RunyardClient
from client.live.logs import show_logs
from service.models import AttemptState, RunState
from tests.fixtures.rows import add_attempt, add_run


def seeded(db_session: Session, tmp_path: Path) -> int:
    """Attempt 1 failed after 3 lines; attempt 2 is running with a half-written line."""
    run = add_run(db_session, RunState.RUNNING)
    for number, state, job, text in (
        (1, AttemptState.FAILED, "101", "step 1\nstep 2\nstep 3\n"),
        (2, AttemptState.RUNNING, "102", "resumed at 2\nstep 3\nstep 4 half"),
    ):
        folder = tmp_path / f"attempt-{number:03d}"
        folder.mkdir()
        (folder / f"{job}_0_log.out").write_text(text)
        (folder / f"{job}_1_log.out").write_text(f"rank 1 of attempt {number}\n")
        add_attempt(db_session, run, number, state, str(folder), slurm_job_id=job)
    return run.id


def test_chunks_end_on_line_breaks_and_offsets_resume(
    api: Any, db_session: Session, tmp_path: Path
) -> None:
    run_id = seeded(db_session, tmp_path)
    first = api.get(f"/v1/runs/{run_id}/logs", params={"attempt": 1, "limit": 10}).json()
    assert first["text"] == "step 1\n"  # 10 bytes asked, cut after the last whole line
    assert first["next_offset"] == 7 and first["size_bytes"] == 21
    rest = api.get(
        f"/v1/runs/{run_id}/logs", params={"attempt": 1, "offset": first["next_offset"]}
    ).json()
    assert rest["text"] == "step 2\nstep 3\n" and rest["attempt_state"] == "FAILED"

    live = api.get(f"/v1/runs/{run_id}/logs").json()  # newest attempt by default
    assert live["attempt"] == 2 and live["latest_attempt"] == 2 and live["num_ranks"] == 2
    # The attempt still runs: its unfinished last line waits for the next poll.
    assert live["text"] == "resumed at 2\nstep 3\n"
    assert live["next_offset"] < live["size_bytes"]


def test_missing_output_unknown_attempt_and_bad_rank(
    api: Any, db_session: Session, tmp_path: Path
) -> None:
    run_id = seeded(db_session, tmp_path)
    run = add_run(db_session, RunState.PENDING)
    add_attempt(db_session, run, 1, AttemptState.SUBMITTING, str(tmp_path / "nothing"))
    waiting = api.get(f"/v1/runs/{run.id}/logs").json()
    assert waiting["exists"] is False and waiting["text"] == "" and waiting["next_offset"] == 0

    missing = api.get(f"/v1/runs/{run_id}/logs", params={"attempt": 9})
    assert missing.status_code == 404 and "no attempt 9" in missing.json()["detail"]
    bad_rank = api.get(f"/v1/runs/{run_id}/logs", params={"rank": 2})
    assert bad_rank.status_code == 422 and "rank" in bad_rank.json()["detail"]


def test_cli_prints_every_attempt_in_order_with_headers(
    api: Any, db_session: Session, tmp_path: Path
) -> None:
    run_id = seeded(db_session, tmp_path)
    client = RunyardClient("http://localhost")  # the app in-process below; loopback: a token may go
    client._http = api  # the real app in-process: TestClient is an httpx.Client
    out: list[str] = []
    show_logs(client, run_id, out.append, lambda h: out.append(f"[{h}]\n"), rank=1)
    assert "".join(out) == (
        f"[==> run {run_id} attempt 1 rank 1 <==]\nrank 1 of attempt 1\n"
        f"[==> run {run_id} attempt 2 rank 1 <==]\nrank 1 of attempt 2\n"
    )
    only_second: list[str] = []
    show_logs(client, run_id, only_second.append, only_second.append, attempt=2)
    assert only_second == ["resumed at 2\nstep 3\n"]
