"""The agent's checks run once, as Slurm's `HealthCheckProgram`: a node that fails them is
drained by Slurm itself, with runyard's reason prefix, before a job lands on it.

The long-running agent reports signals as they happen and the service decides; this mode
answers a narrower question for slurmd every HealthCheckInterval: does this node need a
reset before it may run anything? That is, a GPU-reset Xid or a fatal SXid in the kernel log
since the last check, or NVML showing a state that only a reset clears. Exit 0 healthy,
1 drained (or would drain, with --dry-run), 2 refused to run (its folder is not root's own).

It runs as root, so where it keeps its place in the kernel log is root's alone: a folder
the process owns that nobody else may write (RUNYARD_HEALTHCHECK_STATE_ROOT/<node>, not the
agent's state folder, which the agent's user owns and could have planted a link in to make
root overwrite any file). The position is read without following a link and written to a
new file that then replaces it, so even a folder someone got into cannot redirect a write.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from worker.agent.kernel_log import parse_line
from worker.agent.nvml import NvmlWatcher

# Xids whose handling in NVIDIA's "Xid Errors" catalog is a GPU or node reset: the
# DRAIN_AND_MOVE rows of service/recovery/classification.py (a unit test keeps them equal).
RESET_XIDS = frozenset({48, 64, 74, 79, 95, 119, 120})
DRAIN_PREFIX = "runyard:"  # the service resumes only nodes whose drain reason carries it
MAX_REASON = 180  # what the service accepts for a drain reason; Slurm shows it in sinfo -R
POSITION_FILE = "healthcheck-position.json"
MAX_POSITION_BYTES = 4096  # {"inode": ..., "offset": ...}; anything longer is not ours


class UnsafeStateDir(Exception):
    """The position's folder or file is not this process's alone: nothing is read or written."""


@dataclass(frozen=True)
class Problem:
    what: str

    def reason(self) -> str:
        return f"{DRAIN_PREFIX} healthcheck: {self.what}"[:MAX_REASON]


def open_state_dir(folder: Path) -> int:
    """A descriptor of `folder` (made 0700 if missing), refused unless this process owns it,
    nobody else may write to it, and it is no link."""
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        raise UnsafeStateDir(f"{folder}: {exc.strerror} (a link, or not a folder)") from exc
    st = os.fstat(fd)
    if st.st_uid != os.geteuid() or st.st_mode & 0o022:
        os.close(fd)
        raise UnsafeStateDir(
            f"{folder} is owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}: "
            f"the health check keeps its place only in a folder of uid {os.geteuid()}'s that "
            "nobody else may write (chown root; chmod 0700)"
        )
    return fd


def read_position(dir_fd: int) -> dict[str, int]:
    """The saved position ({} if none), read without following a link or blocking on one."""
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK
    try:
        fd = os.open(POSITION_FILE, flags, dir_fd=dir_fd)
    except FileNotFoundError:
        return {}
    except OSError as exc:
        raise UnsafeStateDir(f"{POSITION_FILE}: {exc.strerror} (a link?): not read") from exc
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
            raise UnsafeStateDir(f"{POSITION_FILE} is not a regular file: not read")
        seen = json.loads(f.read(MAX_POSITION_BYTES))
    return seen if isinstance(seen, dict) else {}


def write_position(dir_fd: int, position: dict[str, int]) -> None:
    """A new file, made here and nowhere else (O_EXCL: never an existing file or link), then
    renamed over the old position: an entry is replaced, no file is written through."""
    temporary = f".{POSITION_FILE}.{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):  # a crashed check's, or a planted link
        os.unlink(temporary, dir_fd=dir_fd)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    fd = os.open(temporary, flags, 0o600, dir_fd=dir_fd)
    with os.fdopen(fd, "w") as f:
        f.write(json.dumps(position))
    os.replace(temporary, POSITION_FILE, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)


def kernel_problems(kernel_log: Path, state_dir: Path) -> list[Problem]:
    """Reset-class Xids and fatal SXids in the lines added since the last check; the place
    reached is kept in `state_dir` (see the module's docstring: UnsafeStateDir otherwise)."""
    try:
        st = os.stat(kernel_log)
    except FileNotFoundError:
        return []
    dir_fd = open_state_dir(state_dir)
    try:
        seen = read_position(dir_fd)
        offset = seen.get("offset", 0) if seen.get("inode") == st.st_ino else 0
        offset = 0 if st.st_size < offset else offset  # truncated: read it again
        with open(kernel_log, "rb") as f:
            f.seek(offset)
            chunk = f.read()
        complete = chunk[: chunk.rfind(b"\n") + 1]
        problems = []
        for raw in complete.decode("utf-8", "replace").splitlines():
            sig = parse_line(raw)
            if sig is None:
                continue
            if (sig.kind == "xid" and sig.code in RESET_XIDS) or sig.kind == "sxid:fatal":
                problems.append(Problem(f"{sig.kind} {sig.code} on {sig.pci}"))
        write_position(dir_fd, {"inode": st.st_ino, "offset": offset + len(complete)})
    finally:
        os.close(dir_fd)
    return problems


def gpu_problems(expect_gpus: int | None) -> list[Problem]:
    """NVML states that need a reset, and GPUs missing against what the node should have."""
    nvml = NvmlWatcher()
    problems = [
        Problem(message) for kind, _, message in nvml.poll() if kind != "nvml:thermal_throttle"
    ]
    if expect_gpus is not None and nvml.count < expect_gpus:
        problems.append(Problem(f"NVML sees {nvml.count} GPUs, the node has {expect_gpus}"))
    return problems


def drain(node: str, problems: list[Problem]) -> subprocess.CompletedProcess[str]:
    reason = problems[0].reason()
    if len(problems) > 1:
        reason = f"{reason} (+{len(problems) - 1} more)"[:MAX_REASON]
    return subprocess.run(
        ["scontrol", "update", f"nodename={node}", "state=drain", f"reason={reason}"],
        capture_output=True,
        text=True,
        timeout=30,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="runyard-healthcheck", description="runyard's node checks, once (HealthCheckProgram)"
    )
    parser.add_argument(
        "--node", default=os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]
    )
    parser.add_argument("--kernel-log", type=Path, default=Path("/var/log/kern.log"))
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="where it keeps its place, root's own (default /var/lib/runyard-healthcheck/NODE)",
    )
    parser.add_argument("--expect-gpus", type=int, default=None, help="GPUs NVML must see")
    parser.add_argument("--dry-run", action="store_true", help="say what is wrong, drain nothing")
    args = parser.parse_args(argv)
    state = args.state_dir or Path("/var/lib/runyard-healthcheck") / args.node
    try:
        problems = kernel_problems(args.kernel_log, state)
    except UnsafeStateDir as exc:
        print(f"{args.node}: health check not run: {exc}", file=sys.stderr)
        return 2
    problems += gpu_problems(args.expect_gpus)
    if not problems:
        return 0
    for problem in problems:
        print(f"{args.node}: {problem.what}", file=sys.stderr)
    if not args.dry_run:
        done = drain(args.node, problems)
        if done.returncode != 0:
            print(f"{args.node}: scontrol could not drain: {done.stderr.strip()}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
