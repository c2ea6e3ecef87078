"""Fault injection for resume tests: crash a rank at a named point, like a node dying.

RUNYARD_FAULT="<point>:<step>[:<rank>]" (rank defaults to 0) kills that rank with SIGKILL
when it reaches <point> at <step>: no cleanup, no exit handler, as with a lost node. Points:
  after_step     the optimizer step is done (a checkpoint due at it may still be writing:
                 saves are asynchronous)
  before_commit  every rank wrote its checkpoint files, the COMMITTED marker is not yet written
                 (with asynchronous saves, at the step where rank 0 finds the save complete)
Unset in production; the e2e suite and tests/unit/worker set it.
"""

from __future__ import annotations

import os
import signal

POINTS = ("after_step", "before_commit")


def maybe_crash(point: str, step: int, rank: int) -> None:
    """SIGKILL this process if RUNYARD_FAULT names this point, step and rank."""
    spec = os.environ.get("RUNYARD_FAULT")
    if not spec:
        return
    fault_point, fault_step, *fault_rank = spec.split(":")
    if fault_point not in POINTS:
        raise ValueError(f"RUNYARD_FAULT point {fault_point!r} is not one of {POINTS}")
    target_rank = int(fault_rank[0]) if fault_rank else 0
    if (fault_point, int(fault_step), target_rank) == (point, step, rank):
        print(f"RUNYARD_FAULT: killing rank {rank} at {point} of step {step}", flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
