"""Slurm's Prolog and Epilog tell runyard that a job started or ended on a node.

The hook queues one event in the node agent's on-disk outbox and returns at once: a prolog
must be fast and must never fail a job because the service is away. The running agent
delivers it with its other events, in order and exactly once (the idempotency key is the
job, the node and the phase), and the service stores it in the node's history
(`runyard node show NODE`).
"""

from __future__ import annotations

import argparse
import enum
import os
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from worker.agent.outbox import Outbox
from worker.agent.sources import signal_event


class Phase(enum.StrEnum):
    PROLOG = "prolog"
    EPILOG = "epilog"


KINDS = {Phase.PROLOG: "slurm:job_start", Phase.EPILOG: "slurm:job_end"}


def job_event(phase: Phase, node: str, env: Mapping[str, str]) -> dict[str, Any]:
    """The event for one phase of one job on one node, from the variables slurmd sets."""
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job:
        raise ValueError("SLURM_JOB_ID is not set: run this as Slurm's Prolog or Epilog")
    name = env.get("SLURM_JOB_NAME", "")
    data: dict[str, Any] = {"job_id": int(job) if job.isdigit() else job, "job_name": name}
    if env.get("SLURM_JOB_USER"):
        data["user"] = env["SLURM_JOB_USER"]
    if phase is Phase.EPILOG and env.get("SLURM_JOB_EXIT_CODE2"):
        data["exit_code"] = env["SLURM_JOB_EXIT_CODE2"]
    verb = "started" if phase is Phase.PROLOG else "ended"
    return signal_event(
        node, f"{node}:slurm:{job}:{phase.value}", KINDS[phase], None,
        f"job {job} ({name}) {verb} on {node}", data,
    )  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="runyard-slurm-hook")
    parser.add_argument("phase", type=Phase, choices=list(Phase))
    parser.add_argument(
        "--node", default=os.environ.get("SLURMD_NODENAME") or os.uname().nodename.split(".")[0]
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="the agent's (default /var/lib/runyard-agent/NODE)",
    )
    args = parser.parse_args(argv)
    state = args.state_dir or Path("/var/lib/runyard-agent") / args.node
    try:
        Outbox(state / "outbox.sqlite").put([job_event(args.phase, args.node, os.environ)])
    except Exception as exc:  # never fail the job over runyard's bookkeeping
        print(f"runyard {args.phase}: event not queued: {exc}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
