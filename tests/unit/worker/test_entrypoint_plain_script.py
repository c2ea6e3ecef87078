"""A script that never imports runyard, launched through worker/entrypoint.py as is: rank 0's
launcher reads its steps and losses from its output (`progress:`), passes it the run's
folder and the resume point through its own flags and commits the `step-N` folders it
completes (`resume:`); in the user's own Python (`environment:`) runyard's packages are
not importable. Standalone, the reports land in $RUNYARD_METRICS_FILE."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from worker_helpers import run_launchers, tiny_spec

from contract import ResumePoint, WorkerRunConfig
from worker import client
from worker.entrypoint import ScriptFailedError, run_entrypoint, script_argv
from worker.launch import LaunchEnv

REPO_ROOT = Path(__file__).resolve().parents[3]
SCRIPT = REPO_ROOT / "tests" / "fixtures" / "scripts" / "plain_steps.py"
EXAMPLE = REPO_ROOT / "examples" / "plain_torchrun.py"
RANK0 = LaunchEnv("slurm", 0, 1, 0, "127.0.0.1", 29500, "gpu001")
PLAIN = {"pattern": r"step (?P<step>\d+) loss (?P<loss>\S+)"}
FLAGS = {"save_flag": "--save-dir", "flag": "--resume"}


def config(tmp_path: Path, *args: str, **overrides: Any) -> WorkerRunConfig:
    spec = tiny_spec(tmp_path / "ckpt", tmp_path / "cache", steps=6)
    entrypoint = {"script": str(SCRIPT), "args": ["--steps", "6", *args]}
    script = {"entrypoint": entrypoint, "progress": PLAIN, "resume": FLAGS}
    return WorkerRunConfig.model_validate(spec | script | overrides)


def rows(metrics: Path, kind: str) -> list[dict[str, Any]]:
    found = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [row for row in found if row["kind"] == kind]


def test_a_plain_script_reports_commits_and_resumes_through_its_own_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    first = tmp_path / "first.jsonl"
    monkeypatch.setenv(client.ENV_METRICS_FILE, str(first))
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)  # as in a Slurm job's environment
    with pytest.raises(ScriptFailedError, match="exited with 1"):
        # Its step 1 must be reported while it runs: it waits for that (a pipe's buffer
        # would hold the line until the script exits, and hang detection see nothing).
        run_entrypoint(config(tmp_path, "--fail-at", "5", "--wait-for-report"), RANK0, None)
    assert [(r["step"], r["loss"]) for r in rows(first, "metric")] == [
        (1, 10.0), (2, 5.0), (3, 3.3333), (4, 2.5), (5, 2.0)
    ]  # fmt: skip
    commits = rows(first, "checkpoint")
    ckpt = (tmp_path / "ckpt").resolve()
    assert [(c["step"], c["path"], c["state"]) for c in commits] == [
        (2, str(ckpt / "step-2"), "COMMITTED"), (4, str(ckpt / "step-4"), "COMMITTED")
    ]  # fmt: skip
    assert rows(first, "finish") == []  # it crashed: not done
    out, err = capfd.readouterr()
    assert "step 3 loss 3.3333\n" in out and "loading batch 3\n" in err  # the rank's log

    # The next attempt gets the newest commit as its resume point, as the service sends it.
    second = tmp_path / "second.jsonl"
    monkeypatch.setenv(client.ENV_METRICS_FILE, str(second))
    resume = ResumePoint(step=4, path=commits[-1]["path"])
    cfg = config(tmp_path, resume_from=resume.model_dump(), attempt_number=2)
    assert script_argv(cfg)[-4:] == ["--save-dir", str(tmp_path / "ckpt"), "--resume", resume.path]
    run_entrypoint(cfg, RANK0, service_url=None)
    out, _ = capfd.readouterr()
    assert f"resumed from {resume.path} at step 4" in out
    assert [r["step"] for r in rows(second, "metric")] == [5, 6]
    assert [c["step"] for c in rows(second, "checkpoint")] == [6]  # not 2 and 4 again
    assert rows(second, "finish") == [
        {"kind": "finish", "final_step": 6, "final_checkpoint_step": 6}
    ]


def test_in_the_users_own_python_runyard_is_not_importable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    """The environment's interpreter (here a wrapper around the system's Python, which has
    no runyard) runs the script, with runyard's folder taken off PYTHONPATH."""
    env_bin = tmp_path / "env" / "bin"
    env_bin.mkdir(parents=True)
    python = env_bin / "python"
    python.write_text('#!/bin/sh\nexec /usr/bin/python3 "$@"\n')
    python.chmod(0o755)
    monkeypatch.setenv("PYTHONPATH", str(REPO_ROOT))
    monkeypatch.setenv(client.ENV_METRICS_FILE, str(tmp_path / "metrics.jsonl"))
    cfg = config(tmp_path, environment={"python": str(python)})
    assert script_argv(cfg)[:2] == [str(python), str(SCRIPT)]
    run_entrypoint(cfg, RANK0, service_url=None)
    out, _ = capfd.readouterr()
    assert "python /usr/bin/python3 runyard importable: False" in out, out
    # ...where runyard's own Python, with the same PYTHONPATH, imports it.
    run_entrypoint(config(tmp_path / "own"), RANK0, service_url=None)
    out, _ = capfd.readouterr()
    assert f"python {sys.executable} runyard importable: True" in out, out


@pytest.mark.heavy
@pytest.mark.timeout(600)
def test_the_plain_torchrun_example_resumes_bit_for_bit_from_its_own_dcp_checkpoint(
    tmp_path: Path,
) -> None:
    """examples/plain_torchrun.py on two ranks (gloo), as Slurm tasks run it: its DCP
    `step-N` folders are committed, and resumed from step 4 it trains steps 5 and 6 to the
    same losses."""
    example = {"script": str(EXAMPLE), "args": ["--steps", "6", "--checkpoint-every", "2"]}

    def launch(metrics: Path, **overrides: Any) -> list[dict[str, Any]]:
        spec = tiny_spec(tmp_path / "ckpt", tmp_path / "cache", steps=6)
        cfg = WorkerRunConfig.model_validate(
            spec | {"entrypoint": example, "progress": PLAIN, "resume": FLAGS} | overrides
        )
        path = tmp_path / f"config-{metrics.stem}.json"
        path.write_text(cfg.model_dump_json())
        run_launchers(path, metrics)
        return [json.loads(line) for line in metrics.read_text().splitlines()]

    whole = launch(tmp_path / "whole.jsonl")
    losses = {r["step"]: r["loss"] for r in whole if r["kind"] == "metric"}
    assert sorted(losses) == [1, 2, 3, 4, 5, 6]
    commits = {r["step"]: r["path"] for r in whole if r["kind"] == "checkpoint"}
    assert sorted(commits) == [2, 4, 6] and Path(commits[4]).name == "step-4"
    assert (Path(commits[4]) / ".metadata").is_file()

    resume = ResumePoint(step=4, path=commits[4])
    again = launch(tmp_path / "resumed.jsonl", resume_from=resume.model_dump(),
                   checkpoint_dir=str(tmp_path / "ckpt2"))  # fmt: skip
    resumed = {r["step"]: r["loss"] for r in again if r["kind"] == "metric"}
    assert sorted(resumed) == [5, 6]
    for step, loss in resumed.items():
        assert loss == pytest.approx(losses[step], rel=1e-6), step
    assert [r["final_step"] for r in again if r["kind"] == "finish"] == [6]


def test_the_worker_config_keeps_the_script_fields_to_an_entrypoint(tmp_path: Path) -> None:
    trainer = tiny_spec(tmp_path / "ckpt", tmp_path / "cache")
    for field, value in (("progress", PLAIN), ("resume", FLAGS)):
        with pytest.raises(ValueError, match=f"{field}: only for an entrypoint script"):
            WorkerRunConfig.model_validate(trainer | {field: value})
