"""Submit one attempt of a run through submitit: the sbatch parameters come from one place."""

from __future__ import annotations

import logging
import os
import pickletools
import re
import shlex
import stat
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import submitit
from submitit.core.utils import JobPaths
from submitit.helpers import CommandFunction

from service.config import Settings
from service.slurm.commands import slurm_error
from service.slurm.owner import OwnerAccessError, OwnerFailure, RunOwner

log = logging.getLogger(__name__)
# submitit pickles each task as <32 hex digits>.pkl, runs sbatch, and only then renames the
# pickle to <job id>_submitted.pkl, which the job waits 60 s for at start before failing.
_SUBMITIT_TEMPORARY_PICKLE = re.compile(r"[0-9a-f]{32}\.pkl")
ATTEMPT_ID_FLAG = "--attempt-id"  # worker.entry's; how a pickled command names its attempt


# Who a job runs as when a test or a tool builds a request without one (the fake's tests).
NOBODY = RunOwner(unix_user="", slurm_account="")


@dataclass(frozen=True)
class SubmitSettings:
    """What a submission needs of the service's settings. It crosses to the process that
    submits as the run's owner (service/identity/as_owner.py) as JSON, so it is plain data."""

    partition: str
    api_url: str
    worker_python: str | None
    # The CA the job's workers verify the service's certificate with (RUNYARD_CA in the
    # job's environment); None: the system's store.
    ca_file: str | None = None
    # The owner's files: folders team-readable, nothing for others (docs/install.md).
    umask: int = 0o027
    # sbatch --clusters: the cluster a multi-cluster target names (service/slurm/target.py);
    # None: the cluster SLURM_CONF reaches.
    clusters: str | None = None

    @classmethod
    def of(
        cls, settings: Settings, partition: str | None = None, clusters: str | None = None
    ) -> SubmitSettings:
        """The site's settings, on a cluster's partition and reached with --clusters where
        that cluster is reached through Slurm's multi-cluster operation."""
        return cls(
            partition=partition or settings.partition,
            clusters=clusters,
            api_url=settings.api_url,
            worker_python=settings.worker_python,
            ca_file=None if settings.ca is None else str(settings.ca),
            umask=settings.umask,
        )


@dataclass(frozen=True)
class AttemptRequest:
    """What Slurm must give one attempt."""

    run_id: int
    attempt_id: int
    job_name: str
    job_folder: Path
    num_nodes: int
    ranks_per_node: int
    time_limit_min: int
    nodelist: str = ""
    reservation: str | None = None
    nice: int = 0  # Slurm's own ordering of pending jobs follows runyard's priority classes
    owner: RunOwner = NOBODY  # the job runs as this Unix user, charged to its account
    # Made by the owner before sbatch, so the run's checkpoints are theirs from the start.
    checkpoint_folder: Path | None = None
    # The owner's own folders under the jobs, checkpoints and data roots: they must exist
    # and be the owner's (an admin makes them), so no one else can make the run's first.
    owner_roots: tuple[Path, ...] = ()
    # topology/block: each this many nodes (a model replica's) inside one block, asked as
    # `--segment` (Slurm 24.05+); None elsewhere (service/nodes/cluster_topology.py).
    segment: int | None = None

    @property
    def token_file(self) -> Path:
        """The attempt's worker token (mode 0600), read by the batch script at start."""
        return self.job_folder / "worker.token"

    @property
    def token_setup(self) -> str:
        return f'export RUNYARD_TOKEN="$(cat {shlex.quote(str(self.token_file))})"'


@dataclass(frozen=True)
class ArrayRequest:
    """One job array for a sweep: task i is the first attempt `attempt_ids[i]`."""

    sweep_id: int
    attempt_ids: tuple[int, ...]
    run_ids: tuple[int, ...]  # run_ids[i] owns attempt_ids[i]
    job_name: str
    job_folder: Path
    num_nodes: int
    ranks_per_node: int
    time_limit_min: int
    max_parallel: int
    nice: int = 0
    nodelist: str = ""  # array tasks are placed by Slurm; retries are placed by runyard
    reservation: str | None = None
    owner: RunOwner = NOBODY  # a sweep's runs share their submitter's identity
    checkpoint_folders: tuple[Path, ...] = field(default_factory=tuple)  # one per run
    owner_roots: tuple[Path, ...] = ()

    def token_file(self, task: int) -> Path:
        return self.job_folder / "tokens" / f"{task}.token"

    def task_job_id(self, array_id: str, task: int) -> str:
        """Slurm's id for task i. submitit sends a batch of one as a plain job, not an
        array, so a sweep down to one member is just `<id>`."""
        return array_id if len(self.attempt_ids) == 1 else f"{array_id}_{task}"

    def task_job_ids(self, array_id: str) -> dict[int, str]:
        """Attempt id -> Slurm's id for the task that runs it, in task order."""
        return {a: self.task_job_id(array_id, i) for i, a in enumerate(self.attempt_ids)}

    @property
    def token_setup(self) -> str:
        tokens = shlex.quote(str(self.job_folder / "tokens"))
        # A plain job (one member) has no SLURM_ARRAY_TASK_ID: it is task 0.
        return f'export RUNYARD_TOKEN="$(cat {tokens}/"${{SLURM_ARRAY_TASK_ID:-0}}".token)"'


def job_name(prefix: str, run_id: int, attempt_id: int) -> str:
    """Stable and unique, so a service that crashed mid-submit can find the job again."""
    return f"{prefix}-r{run_id}-a{attempt_id}"


def sweep_job_name(prefix: str, sweep_id: int) -> str:
    return f"{prefix}-s{sweep_id}"


def sbatch_parameters(
    req: AttemptRequest | ArrayRequest, settings: SubmitSettings
) -> dict[str, Any]:
    """The one source of truth for how an attempt is asked of Slurm."""
    params: dict[str, Any] = {
        "job_name": req.job_name,
        "partition": settings.partition,
        "nodes": req.num_nodes,
        "ntasks_per_node": req.ranks_per_node,  # one task per GPU
        "gpus_per_node": req.ranks_per_node,
        "cpus_per_task": 1,
        # A training run owns its nodes: nothing else shares their GPUs, memory or NICs.
        "exclusive": True,
        "time": req.time_limit_min,
        "stderr_to_stdout": True,
        # A last resort only: the service stops segments well before their limit itself
        # (reconcile/preemption.py), since submitit handles USR2 by requeueing the job.
        "signal_delay_s": 15,
    }
    if req.nodelist:
        params["nodelist"] = req.nodelist
    # submitit asks Slurm for USR2 before the time limit and handles it in its wrapper by
    # requeueing or failing the job under us. The service stops segments itself, through the
    # ranks' progress replies (reconcile/preemption.py); SIGURG is ignored by every process.
    extra: dict[str, Any] = {"signal": "URG@15"}
    if settings.clusters:
        # Slurm's multi-cluster operation: sbatch sends the job to that cluster's slurmctld.
        extra["clusters"] = settings.clusters
    # Charged to the owner's account, so fair share, QoS limits and sacct see whose it is.
    if req.owner.slurm_account:
        extra["account"] = req.owner.slurm_account
    if req.owner.qos:
        extra["qos"] = req.owner.qos
    if req.nice:
        extra["nice"] = req.nice
    if req.reservation:
        # The run's own reservation keeps its nodes between attempts (see reservations.py).
        extra["reservation"] = req.reservation
    if isinstance(req, AttemptRequest) and req.segment and req.reservation:
        # topology/block: Slurm 24.11 refuses --segment beside a node list ("requires nodes
        # with segment are not supported"), and a node list alone must sit in one aligned
        # block. The run's reservation holds exactly its nodes, so the job asks for them
        # through it and keeps each model replica in a block with --segment.
        extra["segment"] = req.segment
        params.pop("nodelist", None)
    params["additional_parameters"] = extra
    # The token goes through a file, never the command line (visible in ps) or the pickle.
    # The umask first: logs, results and checkpoints the job writes are the owner's and
    # readable by the team only (the site's choice: RUNYARD_RUN_UMASK).
    params["setup"] = [f"umask {settings.umask:04o}", req.token_setup]
    if settings.ca_file is not None:
        params["setup"].append(f"export RUNYARD_CA={shlex.quote(settings.ca_file)}")
    if isinstance(req, ArrayRequest):
        # submitit turns a batch of submissions into `--array=0-(n-1)%array_parallelism`.
        params["array_parallelism"] = req.max_parallel
        if req.num_nodes > 1:
            # Slurm places array tasks, not us: ask for one leaf switch per task, waiting up
            # to five minutes for it (Slurm's max_switch_wait caps this) before taking more.
            extra["switches"] = "1@05:00"
    return params


def worker_command(settings: SubmitSettings, attempt_id: int) -> list[str]:
    python = settings.worker_python or sys.executable
    return [
        python,
        "-u",
        "-m",
        "worker.entry",
        "--service-url",
        settings.api_url,
        ATTEMPT_ID_FLAG,
        str(attempt_id),
    ]


def write_token_file(path: Path, token: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")


def prepare_folders(roots: Sequence[Path], folders: Sequence[Path | None], umask: int) -> None:
    """As the owner: check the owner's own roots (they must exist and be theirs: an admin
    makes them, docs/install.md), then make the run's folders under them with the run's
    umask, refusing one that exists but is someone else's or a link (a folder planted to
    read the run's files or feed it some)."""
    os.umask(umask)
    for root in roots:
        if not root.exists():
            raise OwnerAccessError(
                OwnerFailure.MISSING,
                f"{root} does not exist: an admin makes it for this user once (install -d "
                f"-o <user> -g <team> -m 0750 {root}; docs/install.md, 'Who a run runs as')",
            )
        _check_own(root)
    for folder in filter(None, folders):
        folder.mkdir(parents=True, exist_ok=True)
        _check_own(folder)


def _check_own(folder: Path) -> None:
    found = os.lstat(folder)
    if stat.S_ISLNK(found.st_mode):
        raise OwnerAccessError(
            OwnerFailure.NOT_THEIRS,
            f"{folder} is a symbolic link, not a folder: remove it and submit again",
        )
    if found.st_uid != os.geteuid():
        raise OwnerAccessError(
            OwnerFailure.NOT_THEIRS,
            f"{folder} belongs to uid {found.st_uid}, not to uid {os.geteuid()} whose run "
            "this is: remove it or choose another folder",
        )


def submit_attempt(req: AttemptRequest, settings: SubmitSettings, worker_token: str) -> str:
    """sbatch the attempt as the calling user; returns the Slurm job id. Never call inside a
    DB transaction. Runs in the owner's process (service/identity/as_owner.py)."""
    folders = [req.job_folder.parent, req.job_folder, req.checkpoint_folder]
    prepare_folders(req.owner_roots, folders, settings.umask)
    write_token_file(req.token_file, worker_token)
    executor = submitit.SlurmExecutor(folder=req.job_folder, python=settings.worker_python)
    executor.update_parameters(**sbatch_parameters(req, settings))
    # No env= here: each task must keep the SLURM_* variables srun gives it.
    command = CommandFunction(worker_command(settings, req.attempt_id), verbose=True)
    try:
        job = executor.submit(command)
    except Exception as exc:  # submitit raises plain exceptions carrying sbatch's stderr
        raise slurm_error(f"sbatch of {req.job_name} failed: {exc}") from exc
    return str(job.job_id)


def submit_array(req: ArrayRequest, settings: SubmitSettings, worker_tokens: Sequence[str]) -> str:
    """sbatch one job array as the calling user, task i running attempt `attempt_ids[i]`;
    returns the array's job id (task i is `<id>_<i>`). Never call inside a DB transaction."""
    prepare_folders(req.owner_roots, [req.job_folder, *req.checkpoint_folders], settings.umask)
    for task, token in enumerate(worker_tokens):
        write_token_file(req.token_file(task), token)
    executor = submitit.SlurmExecutor(folder=req.job_folder, python=settings.worker_python)
    executor.update_parameters(**sbatch_parameters(req, settings))
    try:
        with executor.batch():
            jobs = [
                executor.submit(CommandFunction(worker_command(settings, a), verbose=True))
                for a in req.attempt_ids
            ]
    except Exception as exc:  # submitit raises plain exceptions carrying sbatch's stderr
        raise slurm_error(f"sbatch of the job array {req.job_name} failed: {exc}") from exc
    return str(jobs[0].job_id).partition("_")[0]


def encode_request(req: AttemptRequest | ArrayRequest) -> dict[str, Any]:
    """The request as JSON-ready data, for the owner's process."""
    return json_ready(asdict(req))


def decode_attempt_request(data: Mapping[str, Any]) -> AttemptRequest:
    return AttemptRequest(**_typed(AttemptRequest, data))


def decode_array_request(data: Mapping[str, Any]) -> ArrayRequest:
    return ArrayRequest(**_typed(ArrayRequest, data))


def json_ready(value: Any) -> Any:
    if isinstance(value, Path):
        return str(value)
    if isinstance(value, dict):
        return {k: json_ready(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v) for v in value]
    return value


def _typed(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """JSON values back to the dataclass's field types (paths, tuples, the owner)."""
    out: dict[str, Any] = {}
    for f in fields(cls):
        if f.name not in data:
            continue
        value = data[f.name]
        if f.name in ("job_folder", "checkpoint_folder") and value is not None:
            value = Path(value)
        elif f.name in ("checkpoint_folders", "owner_roots"):
            value = tuple(Path(v) for v in value)
        elif f.name in ("attempt_ids", "run_ids"):
            value = tuple(value)
        elif f.name == "owner":
            value = RunOwner(**value)
        out[f.name] = value
    return out


def finish_interrupted_submission(job_folder: Path, job_ids: Mapping[int, str]) -> list[str]:
    """Give each adopted job the pickle a crashed submission left under a temporary name.

    A service killed after sbatch returned but before submitit renamed the task pickles
    leaves jobs that are queued, found again by name and adopted, yet each would wait 60 s
    for `<job id>_submitted.pkl` and fail. `job_ids` maps each attempt to the Slurm id of
    the job (or array task) that runs it. A pickle is matched by the attempt id in its
    worker command, read from the pickle's opcodes without loading it (a job folder is
    writable by the jobs, and loading a pickle runs code); of several for one attempt
    (crashes before sbatch, then after) the newest is the one sbatch ran with. The target
    is a hard link, not a rename: a submitter still alive (a leader losing its lock
    mid-submit) then renames onto the same file without an error. Never raises: what it
    cannot link is logged, and that job fails at start like any failed attempt. Returns
    the job ids whose pickle this put in place.
    """
    newest: dict[int, Path] = {}
    for pickle in job_folder.glob("*.pkl"):
        if not _SUBMITIT_TEMPORARY_PICKLE.fullmatch(pickle.name):
            continue
        attempt = _attempt_in(pickle)
        if attempt is None or attempt not in job_ids:
            continue  # another attempt's, or not a worker command
        if attempt not in newest or _mtime(pickle) > _mtime(newest[attempt]):
            newest[attempt] = pickle
    finished = []
    for attempt, pickle in newest.items():
        target = JobPaths(job_folder, job_id=job_ids[attempt]).submitted_pickle
        try:
            os.link(pickle, target)
        except FileExistsError:
            continue  # submitit got to it first
        except OSError as exc:
            log.error("job %s: cannot put its pickle in place (%s)", job_ids[attempt], exc)
            continue
        finished.append(job_ids[attempt])
        log.warning(
            "job %s: its submission was cut off after sbatch; pickle put in place", job_ids[attempt]
        )
    return finished


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return float("-inf")


def _attempt_in(pickle: Path) -> int | None:
    """The number after ATTEMPT_ID_FLAG among the pickle's strings (worker_command's), or
    None. Walks the opcodes (pickletools) without executing any of them."""
    strings: list[str] = []
    memo: dict[int, str] = {}  # a string met twice is pickled once, then fetched by index
    memoized = 0  # MEMOIZE numbers every object it stores, strings or not
    last: str | None = None
    try:
        for opcode, argument, _ in pickletools.genops(pickle.read_bytes()):
            name = opcode.name
            if isinstance(argument, str) and "UNICODE" in name:
                last = argument
                strings.append(argument)
            elif name == "MEMOIZE":
                if last is not None:
                    memo[memoized] = last
                memoized, last = memoized + 1, None
            elif name in ("PUT", "BINPUT", "LONG_BINPUT") and isinstance(argument, int):
                if last is not None:
                    memo[argument] = last
                last = None
            elif name in ("GET", "BINGET", "LONG_BINGET") and isinstance(argument, int):
                if argument in memo:
                    strings.append(memo[argument])
                last = None
            else:
                last = None
    except (OSError, ValueError) as exc:  # unreadable, or cut off mid-write by the crash
        log.warning("%s: not a readable pickle (%s); left as it is", pickle, exc)
        return None
    if ATTEMPT_ID_FLAG not in strings[:-1]:
        return None
    value = strings[strings.index(ATTEMPT_ID_FLAG) + 1]
    return int(value) if value.isdigit() else None
