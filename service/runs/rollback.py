"""Loss spikes and non-finite values (issue 15): roll the run back past them.

The worker judges every reported step (worker/anomaly.py: a non-finite loss or gradient
norm, or a spike by the run's SpikeRule), reports the first anomaly it finds to the errors
endpoint as `worker:anomaly` with its step, and every rank exits. When the job ends, the
restart policy (service/recovery/restart.py) asks `decide` here:

- the next attempt resumes from the newest committed checkpoint, which is from before the
  anomaly (the worker closes a step's report window before it saves, and saves nothing
  after an anomaly), and the data of training steps
  [max(resume + 1, k - skip_before), k + skip_after] is skipped: from the window's first
  step on, the data position runs that many steps ahead of the step
  (contract.run_config.data_step). The skips are kept in `runs.config["data_skips"]`, in
  the order made, and every later attempt trains with all of them: exact and reproducible.
  A rollback costs none of max_restarts (StopReason.ROLLED_BACK).
- an anomaly within skip_before + skip_after steps of SpikeRule.max_rollbacks_at_step
  earlier ones is not the data: the run stops (StopReason.REPEATED_ANOMALY).

Each rollback is a `run.rolled_back` event on the timeline and a row of
`runs.config["rollbacks"]` (`run show`); goodput counts the steps it threw away as
"rolled back" time (service/runs/goodput.py).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from contract import StopReason
from contract.run_config import DataSkip, SpikeRule
from service.models import Attempt, Run
from service.runs import repository
from service.runs.run_state_machine import record_event
from service.runs.schemas import RunSpec

ANOMALY = "worker:anomaly"  # the kind the worker reports (worker/reporter.py)


def skip_for(anomaly_step: int, resume_step: int, rule: SpikeRule) -> DataSkip:
    """The window of data a rollback to `resume_step` skips for an anomaly at `anomaly_step`:
    training steps [max(resume_step + 1, anomaly_step - skip_before), anomaly_step +
    skip_after], never before the resume point (its steps are already in the weights)."""
    first = max(resume_step + 1, anomaly_step - rule.skip_before)
    return DataSkip(from_step=first, steps=anomaly_step + rule.skip_after - first + 1)


def data_skips(run: Run) -> list[DataSkip]:
    return [DataSkip.model_validate(s) for s in run.config.get("data_skips", [])]


def rollbacks(run: Run) -> list[dict[str, Any]]:
    return list(run.config.get("rollbacks", []))


def spike_rule(run: Run) -> SpikeRule:
    return RunSpec.model_validate(run.spec).spike


def anomaly_of(session: Session, attempt: Attempt) -> dict[str, Any] | None:
    """The earliest anomaly `attempt`'s worker reported, if any (its ErrorReport)."""
    reports = repository.worker_error_reports(session, attempt.id, [ANOMALY])
    found = [r for r in reports if r.get("step") is not None]
    return min(found, key=lambda r: r["step"]) if found else None


def decide(
    session: Session, run: Run, attempt: Attempt, anomaly: dict[str, Any], reason: str
) -> tuple[StopReason, str]:
    """ROLLED_BACK (the skip recorded on the run, an event on its timeline) or, at the same
    place as SpikeRule.max_rollbacks_at_step rollbacks before, REPEATED_ANOMALY."""
    rule, step = spike_rule(run), int(anomaly["step"])
    what = anomaly.get("message", "")[:300]
    near = rule.skip_before + rule.skip_after
    before = [
        r
        for r in rollbacks(run)
        if r.get("kind") != "sdc" and abs(r["anomaly_step"] - step) <= near  # sdc: not data
    ]
    if len(before) >= rule.max_rollbacks_at_step:
        return (
            StopReason.REPEATED_ANOMALY,
            f"{reason}: {what}; the same place (within {near} steps) as "
            f"{len(before)} rollback(s) before (steps "
            f"{', '.join(str(r['anomaly_step']) for r in before)}): skipping data does not "
            "help, stopped instead of rolling back again",
        )
    newest = repository.newest_committed_checkpoint(session, run.id)
    resume = newest.step if newest is not None else 0
    skip = skip_for(step, resume, rule)
    last = skip.from_step + skip.steps - 1
    row = {
        "attempt": attempt.number,
        "anomaly_step": step,
        "message": what,
        "resume_step": resume,
        "skip_from_step": skip.from_step,
        "skip_steps": skip.steps,
    }
    # A new dict: the JSON column sees the change (it is not a mutable-tracking type).
    run.config = {
        **run.config,
        "data_skips": [*run.config.get("data_skips", []), skip.model_dump()],
        "rollbacks": [*rollbacks(run), row],
    }
    since = f"step {resume}" if newest is not None else "scratch"
    text = f"rolled back to {since} after {what}; data of steps {skip.from_step}-{last} skipped"
    record_event(session, run, "run.rolled_back", text, attempt, row)
    return StopReason.ROLLED_BACK, f"{reason}: {text}: does not count against max_restarts"
