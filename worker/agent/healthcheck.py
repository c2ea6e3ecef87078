"""The agent's checks run once, as Slurm's `HealthCheckProgram`: a node that fails them is
drained by Slurm itself, with runyard's reason prefix, before a job lands on it.

The long-running agent reports signals as they happen and the service decides; this mode
answers a narrower question for slurmd every HealthCheckInterval: does this node need a
reset before it may run anything? That is, a GPU-reset Xid or a fatal SXid in the kernel log
since the last check, or NVML showing a state that only a reset clears. Exit 0 healthy,
1 drained (or would drain, with --dry-run).
"""

from __future__ import annotations

import argparse
import json
import os
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


@dataclass(frozen=True)
class Problem:
    what: str

    def reason(self) -> str:
        return f"{DRAIN_PREFIX} healthcheck: {self.what}"[:MAX_REASON]


def kernel_problems(kernel_log: Path, position_file: Path) -> list[Problem]:
    """Reset-class Xids and fatal SXids in the lines added since the last check."""
    try:
        st = os.stat(kernel_log)
    except FileNotFoundError:
        return []
    seen = json.loads(position_file.read_text()) if position_file.exists() else {}
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
    position_file.parent.mkdir(parents=True, exist_ok=True)
    position_file.write_text(json.dumps({"inode": st.st_ino, "offset": offset + len(complete)}))
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
        "--state-dir", type=Path, default=None, help="default /var/lib/runyard-agent/NODE"
    )
    parser.add_argument("--expect-gpus", type=int, default=None, help="GPUs NVML must see")
    parser.add_argument("--dry-run", action="store_true", help="say what is wrong, drain nothing")
    args = parser.parse_args(argv)
    state = args.state_dir or Path("/var/lib/runyard-agent") / args.node
    problems = kernel_problems(args.kernel_log, state / "healthcheck-position.json")
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
