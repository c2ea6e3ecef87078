"""Your own training script under runyard: the launcher gives every rank torchrun's
variables and runyard's, the example DDP script trains, commits its own checkpoints and
resumes from the one it is handed exactly where it stopped, and stop requests reach it."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from worker_helpers import run_launchers, tiny_spec

from contract import Entrypoint, ResumePoint, WorkerRunConfig
from worker import client
from worker.entrypoint import ScriptFailedError, run_entrypoint, script_environment
from worker.errors import DoNotRetryError
from worker.launch import LaunchEnv
from worker.reporter import Reporter

REPO_ROOT = Path(__file__).resolve().parents[3]
EXAMPLE = REPO_ROOT / "examples" / "ddp_train.py"
SMALL = ["--checkpoint-every", "3", "--width", "32", "--batch-size", "4", "--seq-len", "32"]
LAUNCH = LaunchEnv("slurm", 1, 2, 1, "10.0.0.1", 29411, "gpu002")


def config(tmp_path: Path, steps: int, **overrides: Any) -> WorkerRunConfig:
    spec = tiny_spec(tmp_path / "ckpt", tmp_path / "cache", steps=steps, checkpoint_every=3)
    entrypoint = {"script": str(EXAMPLE), "args": SMALL}
    return WorkerRunConfig.model_validate(spec | {"entrypoint": entrypoint} | overrides)


def launch_ranks(cfg: WorkerRunConfig, root: Path, metrics: Path) -> None:
    """Two ranks, each a process running the launcher, as two Slurm tasks would."""
    path = root / f"config-{metrics.stem}.json"
    path.write_text(cfg.model_dump_json())
    run_launchers(path, metrics)


def rows(metrics: Path, kind: str) -> list[dict[str, Any]]:
    found = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [row for row in found if row["kind"] == kind]


@pytest.mark.heavy
@pytest.mark.timeout(600)
def test_the_example_trains_commits_and_resumes_where_it_stopped(tmp_path: Path) -> None:
    whole = tmp_path / "whole.jsonl"
    launch_ranks(config(tmp_path, steps=6), tmp_path, whole)
    losses = {row["step"]: row["loss"] for row in rows(whole, "metric")}
    assert sorted(losses) == [1, 2, 3, 4, 5, 6]
    commits = rows(whole, "checkpoint")
    assert [(c["step"], c["state"]) for c in commits] == [(3, "COMMITTED"), (6, "COMMITTED")]
    assert rows(whole, "finish") == [
        {"kind": "finish", "final_step": 6, "final_checkpoint_step": 6}
    ]

    # The next attempt gets the commit of step 3 as its resume point, as the service sends it.
    resume = ResumePoint(step=3, path=commits[0]["path"])
    resumed = tmp_path / "resumed.jsonl"
    cfg = config(tmp_path, steps=6, resume_from=resume.model_dump(),
                 checkpoint_dir=str(tmp_path / "ckpt2"))  # fmt: skip
    launch_ranks(cfg, tmp_path, resumed)
    again = {row["step"]: row["loss"] for row in rows(resumed, "metric")}
    assert sorted(again) == [4, 5, 6]
    for step, loss in again.items():
        assert loss == pytest.approx(losses[step], rel=1e-6), step


def test_the_script_environment_has_torchrun_and_runyard_variables(tmp_path: Path) -> None:
    stale = {client.ENV_RESUME_STEP: "99", "RANK": "7"}
    fresh = script_environment(config(tmp_path, 6), LAUNCH, "http://svc:8000", stale)
    assert (fresh["RANK"], fresh["WORLD_SIZE"], fresh["LOCAL_RANK"]) == ("1", "2", "1")
    assert (fresh["MASTER_ADDR"], fresh["MASTER_PORT"]) == ("10.0.0.1", "29411")
    assert fresh[client.ENV_SERVICE_URL] == "http://svc:8000"
    assert fresh[client.ENV_CHECKPOINT_DIR] == str(tmp_path / "ckpt")
    assert client.ENV_RESUME_STEP not in fresh  # a fresh start, whatever the parent had
    resume = {"step": 3, "path": "/ckpt/step_3.pt"}
    env = script_environment(config(tmp_path, 6, resume_from=resume), LAUNCH, None, {})
    session = client.Session(env, Reporter())
    assert session.resume == client.Resume(3, "/ckpt/step_3.pt")
    assert (session.rank, session.world_size, session.steps) == (1, 2, 6)


def test_the_script_gets_torchruns_thread_rule_unless_its_user_set_one(tmp_path: Path) -> None:
    # Slurm's cores for the task, else one, as torchrun's OMP_NUM_THREADS=1: not every core
    # of the machine for every rank of a node.
    cfg = config(tmp_path, 6)
    assert script_environment(cfg, LAUNCH, None, {})["OMP_NUM_THREADS"] == "1"
    given = {"SLURM_CPUS_PER_TASK": "12"}
    assert script_environment(cfg, LAUNCH, None, given)["OMP_NUM_THREADS"] == "12"
    own = {"SLURM_CPUS_PER_TASK": "12", "OMP_NUM_THREADS": "4"}
    assert script_environment(cfg, LAUNCH, None, own)["OMP_NUM_THREADS"] == "4"


def test_stop_requests_reach_the_script() -> None:
    before = signal.getsignal(signal.SIGUSR2)
    reporter = Reporter()
    with client.Session({}, reporter) as session:
        assert not session.should_stop
        reporter.cancel_requested = True  # the service answered a report with "stop"
        assert session.should_stop
    session = client.Session({}, Reporter())
    os.kill(os.getpid(), signal.SIGUSR2)  # Slurm's time-limit warning, forwarded
    assert session.should_stop
    session.close()
    assert signal.getsignal(signal.SIGUSR2) is before  # handed back


@pytest.mark.parametrize(("code", "error"), [(3, DoNotRetryError), (1, ScriptFailedError)])
def test_the_scripts_exit_code_is_the_ranks(tmp_path: Path, code: int, error: type) -> None:
    script = tmp_path / "fails.py"
    script.write_text(f"import sys\nsys.exit({code})\n")
    cfg = config(tmp_path, 6).model_copy(update={"entrypoint": Entrypoint(script=str(script))})
    with pytest.raises(error, match=f"exited with {code}"):
        run_entrypoint(cfg, LAUNCH, None)
