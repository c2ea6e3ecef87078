"""A training script's session (runyard_client.connect) against a stand-in service over real
HTTP: what it reads from the launcher's environment, what rank 0 sends, and when it says
stop. The same session under its old name, worker.client, is tested by
tests/unit/worker/test_entrypoint.py."""

from __future__ import annotations

import json
import math
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from runyard_client import PROTOCOL_VERSION, Resume, Session, connect
from runyard_client.reporting import Reporter

from tests.unit.runyard_client.stand_in import StandIn


def wait_until(condition: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Poll what the reporter's background thread makes true (it has no event to wait on)."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def launcher_env(url: str, tmp_path: Path, **extra: str) -> dict[str, str]:
    """What runyard's launcher (worker/entrypoint.py script_environment) sets for rank 0."""
    return {
        "RUNYARD_SERVICE_URL": url,
        "RUNYARD_ATTEMPT_ID": "7",
        "RUNYARD_NODE": "gpu001",
        "RUNYARD_CHECKPOINT_DIR": str(tmp_path / "ckpt"),
        "RUNYARD_STEPS": "6",
        "RUNYARD_REPORT_INTERVAL_S": "0.02",
        "RUNYARD_TOKEN": "s3cret",
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        **extra,
    }


def test_rank_0_reports_steps_commits_and_the_finish(stand_in: StandIn, tmp_path: Path) -> None:
    env = launcher_env(
        stand_in.url, tmp_path, RUNYARD_RESUME_STEP="3", RUNYARD_RESUME_PATH="/ckpt/step_3"
    )
    with connect(env) as session:
        assert (session.rank, session.world_size, session.local_rank) == (0, 2, 0)
        assert session.is_rank0 and session.steps == 6
        assert session.checkpoint_dir == tmp_path / "ckpt"
        assert session.resume == Resume(3, "/ckpt/step_3")
        for step in (4, 5, 6):
            session.report(step, loss=2.0 - step / 10, tokens=4096, lr=1e-3)
        saved = tmp_path / "ckpt" / "step_6"
        assert session.committed(6, saved, num_bytes=123)
        session.finish(6)

    assert stand_in.steps() == [4, 5, 6]  # delivered before the commit (and in order)
    rows = stand_in.bodies("/progress")[0]["metrics"]
    assert {row["lr"] for row in rows} == {1e-3} and all(row["tokens_per_s"] > 0 for row in rows)
    assert stand_in.bodies("/checkpoints") == [
        {"step": 6, "path": str(saved.resolve()), "state": "COMMITTED", "num_bytes": 123,
         "write_s": 0.0}
    ]  # fmt: skip
    assert stand_in.bodies("/finish") == [{"final_step": 6, "final_checkpoint_step": 6}]
    methods_and_paths = stand_in.requests()
    assert methods_and_paths[0] == ("GET", "/v1/worker/protocol")  # asked first, at connect()
    assert methods_and_paths[-1] == ("POST", "/v1/worker/attempts/7/finish")
    for _, _, _, headers in stand_in.received:  # every request: the version and the token
        assert headers["X-Runyard-Protocol"] == str(PROTOCOL_VERSION)
        assert headers["Authorization"] == "Bearer s3cret"


def test_should_stop_follows_the_services_reply(stand_in: StandIn, tmp_path: Path) -> None:
    with connect(launcher_env(stand_in.url, tmp_path)) as session:
        session.report(1, loss=3.0, tokens=10)
        wait_until(lambda: stand_in.steps() == [1])
        assert not session.should_stop
        stand_in.stop_requested = True  # cancelled, preempted or at the end of a segment
        session.report(2, loss=3.0, tokens=10)
        wait_until(lambda: session.should_stop)


def test_sigusr2_asks_every_rank_to_stop_and_is_handed_back() -> None:
    before = signal.getsignal(signal.SIGUSR2)
    session = connect({"RANK": "1", "WORLD_SIZE": "2"})
    assert not session.should_stop
    os.kill(os.getpid(), signal.SIGUSR2)  # Slurm's time-limit warning, forwarded
    assert session.should_stop
    session.close()
    assert signal.getsignal(signal.SIGUSR2) is before


def test_other_ranks_send_nothing(stand_in: StandIn, tmp_path: Path) -> None:
    env = launcher_env(stand_in.url, tmp_path, RANK="1", LOCAL_RANK="1")
    with connect(env) as session:
        assert not session.is_rank0
        session.report(1, loss=3.0, tokens=10)
        assert session.committed(1, tmp_path / "ckpt" / "step_1")
        session.finish(1)
    assert stand_in.received == []


def test_a_non_finite_loss_does_not_hold_back_later_steps(
    stand_in: StandIn, tmp_path: Path
) -> None:
    """JSON has no NaN: the step gets no row, and the steps around it are delivered."""
    with connect(launcher_env(stand_in.url, tmp_path)) as session:
        session.report(1, loss=3.0, tokens=10)
        session.report(2, loss=math.nan, tokens=10)
        session.report(3, loss=2.5, tokens=10)
    assert stand_in.steps() == [1, 3]


def test_standalone_rank_0_writes_its_reports_to_the_metrics_file(tmp_path: Path) -> None:
    metrics = tmp_path / "metrics.jsonl"
    with connect({"RUNYARD_METRICS_FILE": str(metrics)}) as session:
        assert session.resume is None and session.steps is None
        session.report(1, loss=3.0, tokens=10)
        session.committed(1, tmp_path / "step_1")
        session.finish(1)
    kinds = [json.loads(line)["kind"] for line in metrics.read_text().splitlines()]
    assert kinds == ["metric", "checkpoint", "finish"]


def test_a_session_takes_any_reporter(tmp_path: Path) -> None:
    """Session(environ, reporter): how runyard's own tests drive it (worker.client)."""
    session = Session({"RANK": "0"}, Reporter())
    assert session.committed(1, tmp_path / "x") and not session.should_stop
    session.close()
