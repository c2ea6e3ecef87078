"""A training script of the user's own that runyard launches on every rank instead of its
trainer: a module (`python -m`) or a script file, with its arguments; the Python it runs
in; and, for a script that never imports runyard, how its progress and its checkpoints are
read from the outside."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path

from pydantic import Field, field_validator, model_validator

from ._frozen import Frozen

# The package the script's Python must hold (`pip install <runyard repo>/runyard-client`);
# the worker protocol its PROTOCOL_VERSION names must be one the service speaks.
CLIENT_PACKAGE = "runyard_client"
# The folder holding runyard's packages (contract, worker, service): never on the import
# path of a script that runs in its own environment.
RUNYARD_ROOT = Path(__file__).resolve().parents[1]
# A command-line flag the launcher appends: `--name` or `-n`, with dots (torchtitan's
# `--checkpoint.folder`), no `=value`, nothing a shell would read.
FLAG = r"^--?[A-Za-z0-9][A-Za-z0-9._-]*$"


class Entrypoint(Frozen):
    """`python -m <module> <args>` or `python <script> <args>` on every rank, with the
    torch.distributed environment and runyard's (see worker/client.py)."""

    module: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$",
        description="A module importable on the nodes, run as `python -m module`.",
    )
    script: str | None = Field(
        default=None,
        min_length=1,
        max_length=4096,
        description="A Python file on the shared filesystem, run as `python script`.",
    )
    args: tuple[str, ...] = Field(default=(), max_length=1000, description="Its arguments.")

    @model_validator(mode="after")
    def _one_target(self) -> Entrypoint:
        if (self.module is None) == (self.script is None):
            raise ValueError("give exactly one of module or script")
        return self

    def argv(self, python: str) -> list[str]:
        """The command line on a rank, with this interpreter."""
        target = ["-m", self.module] if self.module is not None else [str(self.script)]
        return [python, *target, *self.args]


class ScriptEnvironment(Frozen):
    """The user's own Python (a venv or a conda environment on the shared filesystem) that
    the ranks run the entrypoint in. runyard's launcher stays in runyard's environment and
    starts it as its child; of runyard, only `runyard_client` must be installed in it."""

    python: str = Field(
        min_length=1,
        max_length=4096,
        description="Absolute path of the interpreter, e.g. /shared/envs/llm/bin/python; it "
        "must import torch and runyard_client (checked as the run's owner at submission).",
    )

    @field_validator("python")
    @classmethod
    def _absolute(cls, python: str) -> str:
        if not python.startswith("/") or "\0" in python:
            raise ValueError(f"'{python[:200]}' is not an absolute path")
        return python


class ProgressPattern(Frozen):
    """How the launcher reads progress from a script that never imports runyard: each line
    rank 0 prints (stdout or stderr, colour codes removed) is searched with `pattern`; the
    named group `step` is the optimizer step, the optional group `loss` its loss."""

    pattern: str = Field(
        min_length=1,
        max_length=1000,
        description=r"A Python regular expression with a named group `step` and optionally "
        r"`loss`, e.g. `step:\s*(?P<step>\d+)\s+loss:\s*(?P<loss>[-+.\deE]+)` (torchtitan).",
    )

    @field_validator("pattern")
    @classmethod
    def _names_the_step(cls, pattern: str) -> str:
        try:
            compiled = re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"does not compile: {exc}") from None
        if "step" not in compiled.groupindex:
            raise ValueError(
                "has no named group `step`: write the step's digits as (?P<step>\\d+) "
                "(and the loss, optionally, as (?P<loss>\\S+))"
            )
        return pattern

    def compiled(self) -> re.Pattern[str]:
        return re.compile(self.pattern)


class ScriptResume(Frozen):
    """The script's own flags for where it saves and what it resumes from: the launcher
    appends `<save_flag> <the run's checkpoint folder>` always and `<flag> <the resume
    point's path>` when the run has one, and commits the checkpoints the script writes there
    once they are complete (worker/script_checkpoints.py names the layouts it knows)."""

    save_flag: str = Field(
        pattern=FLAG,
        max_length=200,
        description="The flag that takes the folder to save checkpoints in, e.g. --save-dir, "
        "--output_dir (Hugging Face), --checkpoint.folder (torchtitan).",
    )
    flag: str | None = Field(
        default=None,
        pattern=FLAG,
        max_length=200,
        description="The flag that takes the checkpoint to resume from, e.g. --resume, "
        "--resume_from_checkpoint (Hugging Face); None: the script finds its own in the save "
        "folder (then it may pick one newer than the service's resume point after a rollback).",
    )


def script_python_environment(environ: Mapping[str, str], python: str) -> dict[str, str]:
    """The environment a script runs in with the user's own `python` (the launcher's, and the
    submission's check of that interpreter): runyard's folder off PYTHONPATH and runyard's
    PYTHONHOME and VIRTUAL_ENV gone, so only what that environment installed imports;
    its `bin` first on PATH, as activating it would (its tools, compilers included)."""
    env = dict(environ)
    kept = [
        entry
        for entry in env.get("PYTHONPATH", "").split(os.pathsep)
        if entry and not _is_runyard_root(entry)
    ]
    env.pop("PYTHONPATH", None)
    if kept:
        env["PYTHONPATH"] = os.pathsep.join(kept)
    env.pop("PYTHONHOME", None)
    env.pop("VIRTUAL_ENV", None)
    bin_dir = os.path.dirname(python)  # not resolved: a venv's python links out of its bin
    if os.path.isfile(os.path.join(os.path.dirname(bin_dir), "pyvenv.cfg")):
        env["VIRTUAL_ENV"] = os.path.dirname(bin_dir)
    env["PATH"] = os.pathsep.join(filter(None, [bin_dir, env.get("PATH", "")]))
    return env


def _is_runyard_root(entry: str) -> bool:
    try:
        return Path(entry).resolve() == RUNYARD_ROOT
    except (OSError, RuntimeError):
        return False
