"""An entrypoint in the user's own Python (`environment.python`), and a script that never
imports runyard (`progress:`, `resume:`), checked at submission: the interpreter is run as
the run's owner (the tests' admin runs as `ops`, through the same sudoers rule and owner's
program as every owner check, service/identity/), and a problem is a 422 naming the field.

The interpreters here are throwaway shell scripts that answer as a Python would."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from client.commands.run import print_decision
from client.output import console
from contract import PROTOCOL_VERSION as CLIENT_PROTOCOL_VERSION
from service.config import get_settings
from service.models import AttemptState, Run
from service.runs.service import worker_config
from tests.conftest import ADMIN_UNIX_USER
from tests.fixtures.rows import add_attempt

SPEC: dict[str, Any] = {
    "name": "own-env", "model": "tiny", "nodes": 2, "gpus_per_node": 1, "seq_len": 64,
    "global_batch": 8, "steps": 100, "checkpoint_every": 20,
    "entrypoint": {"script": "examples/plain_torchrun.py", "args": ["--steps", "100"]},
}  # fmt: skip
TORCHTITAN = r"step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>[-+.\deE]+)"
MISSING = "Traceback (most recent call last):\nModuleNotFoundError: No module named '{}'"


def interpreter(folder: Path, name: str, *, prints: str = "", fails_with: str = "") -> str:
    """A shell script standing in for an environment's python: it prints the probe's
    version line, or a traceback on stderr and exits 1."""
    path = folder / name
    answer = f"cat >&2 <<'EOF'\n{fails_with}\nEOF\nexit 1" if fails_with else f"echo '{prints}'"
    path.write_text(f"#!/bin/sh\n{answer}\n")
    path.chmod(0o755)
    return str(path)


def with_python(python: str, **extra: Any) -> dict[str, Any]:
    return SPEC | {"environment": {"python": python}} | extra


def refusal(api: Any, spec: dict[str, Any]) -> str:
    refused = api.post("/v1/runs/dry-run", json=spec)
    assert refused.status_code == 422, refused.text
    detail: str = refused.json()["detail"]
    return detail


def test_the_dry_run_shows_the_python_and_torch_versions_its_owner_runs(
    api: Any, shared_path: Path
) -> None:
    python = interpreter(
        shared_path, "python", prints=f"3.11.9 2.5.1+cpu {CLIENT_PROTOCOL_VERSION}"
    )
    decided = api.post("/v1/runs/dry-run", json=with_python(python))
    assert decided.status_code == 200, decided.text
    assert decided.json()["environment"] == {
        "python": python, "python_version": "3.11.9", "torch_version": "2.5.1+cpu",
        "client_protocol": CLIENT_PROTOCOL_VERSION,
    }  # fmt: skip
    with console.capture() as shown:  # `runyard run submit --dry-run`
        print_decision(decided.json())
    assert f"python: {python} (Python 3.11.9, torch 2.5.1+cpu, runyard_client protocol " in (
        shown.get()
    )
    assert api.post("/v1/runs/dry-run", json=SPEC).json()["environment"] is None


@pytest.mark.parametrize(
    ("name", "answer", "says"),
    [
        ("missing", None, "does not exist"),
        ("no-torch", MISSING.format("torch"), "lacks torch"),
        ("no-client", MISSING.format("runyard_client"), "lacks runyard_client"),
        ("old-client", "3.11.9 2.5.1 99", f"protocol 99, the service {CLIENT_PROTOCOL_VERSION}"),
        ("broken", "Traceback (most recent call last):\nImportError: libcudart.so.12", "libcudart"),
    ],
)  # fmt: skip
def test_an_interpreter_that_cannot_train_is_refused_naming_the_field(
    api: Any, shared_path: Path, name: str, answer: str | None, says: str
) -> None:
    if answer is None:
        python = str(shared_path / "no-such-env" / "bin" / "python")
    elif answer.startswith("Traceback"):
        python = interpreter(shared_path, name, fails_with=answer)
    else:
        python = interpreter(shared_path, name, prints=answer)
    detail = refusal(api, with_python(python))
    assert detail.startswith(f"environment.python: {python} "), detail
    assert says in detail, detail


def test_an_interpreter_its_owner_cannot_execute_is_refused_whoever_else_could(
    api: Any, shared_path: Path
) -> None:
    """Root (who runs the tests, and the service in them) may run it; the owner, ops, may
    not: the check used the owner's rights."""
    python = interpreter(
        shared_path, "roots-only", prints=f"3.11.9 2.5.1 {CLIENT_PROTOCOL_VERSION}"
    )
    shutil.chown(python, "root", "root")
    os.chmod(python, 0o700)
    assert os.access(python, os.X_OK)  # the service's own user could
    detail = refusal(api, with_python(python))
    assert detail == f"environment.python: {python} is not executable by {ADMIN_UNIX_USER}"
    os.chmod(python, 0o644)  # nobody may
    assert "is not executable by" in refusal(api, with_python(python))


def test_a_relative_interpreter_path_is_refused(api: Any) -> None:
    detail = refusal(api, with_python("venv/bin/python"))
    assert detail.startswith("environment.python: ") and "not an absolute path" in detail


@pytest.mark.parametrize(
    ("pattern", "says"),
    [
        (r"step (\d+) loss (?P<loss>\S+)", "has no named group `step`"),
        (r"step (?P<step>\d+", "does not compile"),
    ],
)
def test_a_progress_pattern_needs_a_step_group_and_must_compile(
    api: Any, pattern: str, says: str
) -> None:
    detail = refusal(api, SPEC | {"progress": {"pattern": pattern}})
    assert detail.startswith("progress.pattern: ") and says in detail, detail


def test_environment_progress_and_resume_are_for_an_entrypoint_only(api: Any) -> None:
    """runyard's own trainer runs in runyard's environment and reports itself."""
    trainer = {k: v for k, v in SPEC.items() if k != "entrypoint"}
    for field, value in (
        ("environment", {"python": "/usr/bin/python3"}),
        ("progress", {"pattern": TORCHTITAN}),
        ("resume", {"save_flag": "--save-dir"}),
    ):
        detail = refusal(api, trainer | {field: value})
        assert detail.startswith(f"{field}: ") and "only for an entrypoint script" in detail


def test_resume_flags_are_flags(api: Any) -> None:
    detail = refusal(api, SPEC | {"resume": {"save_flag": "--save-dir; rm -rf ~"}})
    assert detail.startswith("resume.save_flag: "), detail


def test_an_accepted_spec_reaches_the_workers_config(
    api: Any, db_session: Session, shared_path: Path
) -> None:
    python = interpreter(shared_path, "python", prints=f"3.11.9 2.5.1 {CLIENT_PROTOCOL_VERSION}")
    script = {"progress": {"pattern": TORCHTITAN}, "resume": {"save_flag": "--checkpoint.folder"}}
    created = api.post("/v1/runs", json=with_python(python, **script))
    assert created.status_code == 201, created.text
    run = db_session.get(Run, created.json()["id"])
    assert run is not None
    config = worker_config(db_session, run, add_attempt(db_session, run, 1, AttemptState.RUNNING),
                           get_settings())  # fmt: skip
    assert config.environment is not None and config.environment.python == python
    assert config.progress is not None and config.progress.pattern == TORCHTITAN
    assert config.resume is not None and config.resume.save_flag == "--checkpoint.folder"
    assert config.resume.flag is None
