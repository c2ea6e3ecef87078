"""Acting as a run's owner: where the service crosses from its own user to a user's.

The service runs as its own unprivileged Unix user. What it must do with a user's rights
(submit their jobs, read their logs and their inputs) it asks `service.identity.as_owner`
to do, run as that user through sudo under one narrow rule (docs/install.md step 3):

    runyard ALL=(%runyard-users) NOPASSWD: <python> -I -m service.identity.as_owner

so the service can act as the members of one group (never root: root is in no such group
unless the site puts it there, and `runyard doctor` says so), and only through this one
program, with a JSON request on stdin. When the service already is the owner (one user
running everything on a workstation) the same program runs without sudo: one code path.

Never call it inside a database transaction: it starts a process that may call Slurm.
"""

from __future__ import annotations

import base64
import json
import os
import pwd
import re
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from service.config import ServiceEnvironment, Settings
from service.config_areas.clusters import ClusterConfig
from service.identity.python_probe import PROBE_TIMEOUT_S, ProbedPython, answer_of
from service.slurm.commands import slurm_error
from service.slurm.owner import OwnerAccessError, OwnerFailure, RunOwner
from service.slurm.submit import ArrayRequest, AttemptRequest, SubmitSettings, encode_request
from service.slurm.target import SlurmTarget

INSPECT_TIMEOUT_S = 20.0
STOP_GRACE_S = 5.0  # after a timeout's SIGTERM, before SIGKILL
# sbatch through submitit starts an interpreter, imports submitit and waits for slurmctld.
TIMEOUT_S = 60.0
JOB_ID = re.compile(r"[0-9]{1,12}")
# The fault hooks of the tests (worker/faults.py): what a dev service hands its jobs.
FAULT_HOOKS = ("RUNYARD_FAULT",)
# sudo's own refusals (its stderr), as opposed to the program's answer on stdout.
SUDO_REFUSALS = (
    "a password is required",
    "is not allowed to",
    "not in the sudoers",
    "unknown user",
)


class OwnerGate:
    """Runs operations of `service.identity.as_owner` as a given Unix user."""

    def __init__(self, settings: Settings, cluster: ClusterConfig | None = None) -> None:
        """Acting as owners on `cluster` (None: the Slurm the service's environment
        reaches): its submissions go to that cluster's partition and controller."""
        self.settings = settings
        self.python = settings.owner_python or owner_python()
        self.cluster = cluster
        if cluster is None:
            self.target = SlurmTarget("", settings.slurm_conf)
        else:
            self.target = SlurmTarget.of(cluster, settings.slurm_conf)

    # What the reconciler and the API ask.
    def submit(self, req: AttemptRequest, worker_token: str) -> str:
        """sbatch one attempt as its owner; the job id."""
        answer = self._call(
            req.owner, "submit", {"request": encode_request(req), "worker_token": worker_token}
        )
        return job_id_of(answer, req.owner)

    def submit_array(self, req: ArrayRequest, worker_tokens: Sequence[str]) -> str:
        """sbatch a sweep's job array as its owner; the array's job id."""
        payload = {"request": encode_request(req), "worker_tokens": list(worker_tokens)}
        return job_id_of(self._call(req.owner, "submit_array", payload), req.owner)

    def finish_submission(
        self, owner: RunOwner, job_folder: Path, job_ids: Mapping[int, str]
    ) -> None:
        payload = {
            "job_folder": str(job_folder),
            "job_ids": {str(a): j for a, j in job_ids.items()},
        }
        self._call(owner, "finish_submission", payload)

    def inspect(
        self,
        owner: RunOwner,
        *,
        from_hf: str | None,
        model: Mapping[str, Any] | None,
        data: str,
        seq_len: int,
        eval_every: int | None,
    ) -> dict[str, Any]:
        """The spec's inputs read as the owner: {"shape": ..., "problems": [...]}."""
        payload = {
            "from_hf": from_hf,
            "model": dict(model) if model is not None else None,
            "data": data,
            "seq_len": seq_len,
            "eval_every": eval_every,
        }
        # Short: a spec's two small files; a read that hangs is refused, not waited on.
        answer = self._call(owner, "inspect", payload, timeout_s=INSPECT_TIMEOUT_S)
        assert isinstance(answer, dict)
        return answer

    def probe_python(self, owner: RunOwner, python: str) -> ProbedPython:
        """`python` as the owner finds it: there, executable by them, and importing torch
        and runyard_client when they run it (service/identity/python_probe.py)."""
        payload = {"python": python, "timeout_s": PROBE_TIMEOUT_S}
        # The probe's own bound, plus the owner's program's start.
        answer = self._call(owner, "probe_python", payload, timeout_s=PROBE_TIMEOUT_S + 20)
        return answer_of(answer)

    def read_log(
        self, owner: RunOwner, path: Path, offset: int, limit: int, *, complete: bool
    ) -> tuple[bool, bytes, int]:
        """(exists, bytes from offset, file size) of one rank's output, read as the owner."""
        payload = {"path": str(path), "offset": offset, "limit": limit, "complete": complete}
        answer = self._call(owner, "read_log", payload)
        return bool(answer["exists"]), base64.b64decode(answer["data"]), int(answer["size"])

    def srun_in_job(
        self, owner: RunOwner, job_id: str, num_nodes: int, script: str, timeout_s: float
    ) -> str:
        """`script` beside a job's tasks, as the job's owner (Slurm lets only the owner, root
        and SlurmUser start a step in a job; an operator may not)."""
        payload = {
            "job_id": job_id,
            "num_nodes": num_nodes,
            "script": script,
            "timeout_s": timeout_s,
        }
        return str(self._call(owner, "srun_in_job", payload, timeout_s=timeout_s + TIMEOUT_S))

    # How.
    def _submit_settings(self) -> SubmitSettings:
        partition = self.cluster.partition if self.cluster is not None else None
        return SubmitSettings.of(self.settings, partition, self.target.sbatch_clusters)

    def argv(self, unix_user: str) -> list[str]:
        """The command that runs the owner's program as `unix_user`."""
        program = [self.python, "-I", "-m", "service.identity.as_owner"]
        if _uid_of(unix_user) == os.geteuid():
            return program
        return [shutil.which("sudo") or "sudo", "-n", "-u", unix_user, "--", *program]

    def _call(
        self, owner: RunOwner, op: str, payload: Mapping[str, Any], timeout_s: float = TIMEOUT_S
    ) -> Any:
        if not owner.unix_user:
            raise OwnerAccessError(
                OwnerFailure.CANNOT_ACT,
                "this run has no Unix owner: an admin links its user with "
                "`runyard admin user link <user> --unix <login>`",
            )
        request = {
            "op": op,
            "args": dict(payload),
            "settings": asdict(self._submit_settings()),
            "slurm_conf": str(self.target.slurm_conf) if self.target.slurm_conf else None,
            "cluster": self.target.cluster,
            "multicluster": self.target.multicluster,
            "search_path": os.environ.get("PATH", ""),
            "job_env": jobs_environment(self.settings),
        }
        try:
            done = run_as_owner(self.argv(owner.unix_user), json.dumps(request), timeout_s)
        except subprocess.TimeoutExpired as exc:
            raise slurm_error(
                f"acting as {owner.unix_user} ({op}) took more than {timeout_s:.0f} s: "
                "Socket timed out on send/recv operation"
            ) from exc
        except KeyError:
            raise _no_such_user(owner.unix_user) from None
        return _answer_of(owner.unix_user, op, done)


def run_as_owner(argv: list[str], stdin: str, timeout_s: float) -> subprocess.CompletedProcess[str]:
    """Run the owner's program and wait at most `timeout_s`. On a timeout it is asked to
    stop with SIGTERM, which sudo passes on to the program (the service may not signal a
    process of the owner's itself, and sudo cannot pass on a SIGKILL), then killed."""
    with subprocess.Popen(
        argv,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd="/",  # nothing of the service's working directory reaches the owner
    ) as process:
        try:
            out, err = process.communicate(stdin, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.terminate()
            try:
                process.communicate(timeout=STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                process.kill()
            raise
    return subprocess.CompletedProcess(argv, process.returncode, out, err)


def job_id_of(answer: object, owner: RunOwner) -> str:
    """The job id the owner's program answered with: digits only. The answer comes from a
    process the owner could tamper with, and the id goes on to scancel's command line."""
    job_id = str(answer)
    if not JOB_ID.fullmatch(job_id):
        raise OwnerAccessError(
            OwnerFailure.INVALID,
            f"sbatch as {owner.unix_user} answered {job_id[:40]!r}, not a job id",
        )
    return job_id


def owner_python() -> str:
    """The interpreter the sudoers rule names by default: the environment's `bin/python3`
    (one spelling, whichever of python, python3 or python3.11 started the service)."""
    return str(Path(sys.prefix) / "bin" / "python3")


def jobs_environment(settings: Settings) -> dict[str, str]:
    """What of the service's environment a job gets: on a site nothing; in dev mode the
    test hooks (worker/faults.py, registered from the environment at a rank's start), which
    is how the integration tests crash and slow their runs. A hook left in a site service's
    environment would otherwise crash or slow every user's job. The rest (the database URL
    among it) stays the service's; sudo starts the owner's program with a clean
    environment."""
    if settings.environment != ServiceEnvironment.DEV:
        return {}
    return fault_hooks()


def fault_hooks() -> dict[str, str]:
    """The test fault hooks set in the service's environment (RUNYARD_FAULT*)."""
    return {k: v for k, v in os.environ.items() if k.startswith(FAULT_HOOKS)}


def _uid_of(unix_user: str) -> int:
    return pwd.getpwnam(unix_user).pw_uid


def _no_such_user(unix_user: str) -> OwnerAccessError:
    return OwnerAccessError(
        OwnerFailure.CANNOT_ACT,
        f"Unix user {unix_user} does not exist on the service's host: create it (the same "
        "uid as on the compute nodes) or link the user to another",
    )


def _answer_of(unix_user: str, op: str, done: subprocess.CompletedProcess[str]) -> Any:
    """The program's answer, or the error that says why there is none."""
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if lines else None
    except ValueError:
        answer = None
    if not isinstance(answer, dict):
        stderr = " ".join(done.stderr.split())[-400:]
        if any(refusal in stderr for refusal in SUDO_REFUSALS):
            raise OwnerAccessError(
                OwnerFailure.CANNOT_ACT,
                f"the service may not act as {unix_user}: sudo said '{stderr}'; see "
                "docs/install.md step 3 (the sudoers rule and the runyard-users group)",
            )
        raise OwnerAccessError(
            OwnerFailure.INVALID,
            f"acting as {unix_user} ({op}) gave no answer (exit {done.returncode}): {stderr}",
        )
    if answer.get("ok"):
        return answer.get("result")
    failure, message = OwnerFailure(answer.get("failure", "invalid")), str(answer.get("message"))
    if failure == OwnerFailure.SLURM:
        raise slurm_error(message)  # a refusal, or no answer from slurmctld
    raise OwnerAccessError(failure, message)
