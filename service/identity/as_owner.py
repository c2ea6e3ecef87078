"""What the service does as a run's owner: the one program the sudoers rule lets it run as
another user (`sudo -n -u <owner> <python> -I -m service.identity.as_owner`).

It reads one JSON request on stdin, performs one operation with the owner's rights, and
prints one JSON answer: `{"ok": true, "result": ...}` or `{"ok": false, "failure": <an
OwnerFailure>, "message": "..."}`. The operations are the service's only contact with a
user's files and a user's jobs that Slurm does not let an operator make itself:
- `submit`, `submit_array`: make the run's folders, write the worker token(s), sbatch
  through submitit; the job runs as the owner, charged to the owner's account;
- `finish_submission`: the adoption step after a crash (service/slurm/submit.py);
- `inspect`: read a `from_hf` config and a prepared dataset's index at submission;
- `probe_python`: run the interpreter a spec names (`environment.python`) at submission;
- `read_log`: a chunk of one rank's output;
- `srun_in_job`: a script beside the job's tasks (stack dumps of a hung run);
- `whoami`: who it runs as (`runyard doctor` checks the sudoers rule with it).

The OS decides: a path the owner cannot read fails here with the OS's own words, whatever
the service could read itself. `-I` keeps the caller's environment and working directory
out of the import path; the request carries the few settings each operation needs.
Imports are made per operation, so reading a log chunk costs an interpreter start only.
"""

from __future__ import annotations

import base64
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

Request = dict[str, Any]


def _slurm_environment(request: Request) -> None:
    """sudo reset the environment: give Slurm's commands their config and binaries back."""
    if request.get("slurm_conf"):
        os.environ["SLURM_CONF"] = request["slurm_conf"]
        os.environ["RUNYARD_SLURM_CONF"] = request["slurm_conf"]
    if request.get("search_path"):
        os.environ["PATH"] = request["search_path"]
    os.environ.update(request.get("job_env") or {})  # sbatch hands its environment to the job


def submit(request: Request) -> Any:
    from service.slurm.submit import SubmitSettings, decode_attempt_request, submit_attempt

    _slurm_environment(request)
    args = request["args"]
    req = decode_attempt_request(args["request"])
    return submit_attempt(req, SubmitSettings(**request["settings"]), args["worker_token"])


def submit_array(request: Request) -> Any:
    from service.slurm.submit import SubmitSettings, decode_array_request
    from service.slurm.submit import submit_array as sbatch_array

    _slurm_environment(request)
    args = request["args"]
    req = decode_array_request(args["request"])
    return sbatch_array(req, SubmitSettings(**request["settings"]), args["worker_tokens"])


def finish_submission(request: Request) -> Any:
    from service.slurm.submit import finish_interrupted_submission

    args = request["args"]
    job_ids = {int(attempt): job for attempt, job in args["job_ids"].items()}
    return finish_interrupted_submission(Path(args["job_folder"]), job_ids)


def inspect(request: Request) -> Any:
    """A spec's inputs as its owner sees them: the `from_hf` shape and the dataset's fit."""
    from contract import HfCheckpointError, ModelShape, check_dataset, read_hf_checkpoint

    args = request["args"]
    problems: list[dict[str, str]] = []
    shape: ModelShape | None = None
    if args.get("from_hf"):
        try:
            shape = read_hf_checkpoint(Path(args["from_hf"]))
        except HfCheckpointError as exc:
            problems.append({"field": "model.from_hf", "message": str(exc)})
    else:
        shape = ModelShape.model_validate(args["model"])
    if shape is not None:
        found = check_dataset(args["data"], shape, args["seq_len"], args["eval_every"])
        problems += [{"field": p.field, "message": p.message} for p in found]
    return {"shape": shape.model_dump(mode="json") if shape else None, "problems": problems}


def probe_python(request: Request) -> Any:
    """Whether the owner can run `environment.python`, and what it imports."""
    from service.identity.python_probe import probe

    args = request["args"]
    return probe(str(args["python"]), float(args["timeout_s"]))


def read_log(request: Request) -> Any:
    """A chunk of one rank's output, read with the owner's rights, base64 in the answer."""
    args = request["args"]
    path = Path(args["path"])
    if not path.is_file():
        return {"exists": False, "data": "", "size": 0}
    data, size = read_chunk(path, args["offset"], args["limit"], complete=args["complete"])
    return {"exists": True, "data": base64.b64encode(data).decode(), "size": size}


def read_chunk(path: Path, offset: int, limit: int, *, complete: bool) -> tuple[bytes, int]:
    """Bytes of a rank's output from `offset` (at most `limit`), cut after the last line break
    unless the file is `complete` and fully read; returns them with the file's size."""
    with path.open("rb") as f:
        size = f.seek(0, 2)
        f.seek(min(offset, size))
        data = f.read(limit)
    reached_end = offset + len(data) >= size
    if complete and reached_end:
        return data, size
    if b"\n" in data:
        return data[: data.rindex(b"\n") + 1], size
    # No line break: at the end of a live file the line is still being written (wait for
    # it); short of the end it is a line longer than `limit` (hand it over in pieces).
    return (b"" if reached_end else data), size


def srun_in_job(request: Request) -> Any:
    from service.slurm.commands import srun_in_job as run
    from service.slurm.target import SlurmTarget

    _slurm_environment(request)  # SLURM_CONF: the target's, set here already
    target = SlurmTarget(request.get("cluster") or "", None, bool(request.get("multicluster")))
    args = request["args"]
    return run(target, args["job_id"], args["num_nodes"], args["script"], args["timeout_s"])


def whoami(request: Request) -> Any:
    """Who this program runs as: how `runyard doctor` checks the sudoers rule."""
    import pwd

    return {"uid": os.geteuid(), "user": pwd.getpwuid(os.geteuid()).pw_name}


OPERATIONS: dict[str, Callable[[Request], Any]] = {
    "whoami": whoami,
    "submit": submit,
    "submit_array": submit_array,
    "finish_submission": finish_submission,
    "inspect": inspect,
    "probe_python": probe_python,
    "read_log": read_log,
    "srun_in_job": srun_in_job,
}


def answer(request: Request) -> dict[str, Any]:
    """Perform one request; every failure is an answer, never a traceback on stderr."""
    operation = OPERATIONS.get(request.get("op", ""))
    if operation is None:
        return _failed("invalid", "unknown operation")
    try:
        return {"ok": True, "result": operation(request)}
    except PermissionError as exc:
        return _failed("denied", str(exc))
    except FileNotFoundError as exc:
        return _failed("missing", str(exc))
    except Exception as exc:
        failure = getattr(exc, "failure", None)  # OwnerAccessError says why itself
        if failure is not None:
            return _failed(str(failure), str(exc))
        if _is_slurm_error(exc):  # the caller tells a refusal from no answer by the message
            return _failed("slurm", str(exc))
        if isinstance(exc, OSError | ValueError | KeyError | TypeError):
            return _failed("invalid", str(exc))
        raise


def _is_slurm_error(exc: Exception) -> bool:
    """Whether `exc` is a SlurmError, without importing Slurm's adapters (and the settings
    they read) for a log chunk: an error of a module that was never imported is not one."""
    commands = sys.modules.get("service.slurm.commands")
    return commands is not None and isinstance(exc, commands.SlurmError)


def _failed(failure: str, message: str) -> dict[str, Any]:
    """An OwnerFailure's value and the message (the values are service/slurm/owner.py's,
    spelled here so that answering imports nothing)."""
    return {"ok": False, "failure": failure, "message": message}


def main() -> int:
    try:
        request = json.loads(sys.stdin.read())
    except ValueError as exc:
        print(json.dumps({"ok": False, "failure": "invalid", "message": f"bad request: {exc}"}))
        return 2
    print(json.dumps(answer(request)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
