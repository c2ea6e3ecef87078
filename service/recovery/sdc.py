"""Silent data corruption (issue 15): drain the odd replica's node, roll back past it.

Every `sdc_check_every` steps (RunSpec, default 50) the worker's data-parallel replicas
compare a checksum of their parameters (worker/sdc.py). Each comparison that passes is
reported with the next progress report and kept as `runs.config["sdc_clean_step"]`,
lowered to the resume step whenever an attempt starts below it (a new timeline). A
mismatch is reported as `worker:sdc` with the step, the odd nodes (every replica of a set
without a majority: two replicas cannot say which of them is right) and the attempt's last
clean step, and every rank exits. Then:

- `record_report` (in the report's transaction) opens an `sdc:mismatch` drain-and-move
  incident per named node: the reconciler drains it in Slurm (reason `sdc`) and a spare
  takes its place (recovery/move_to_spare.py);
- when the attempt ends (whichever comes first: the incident or the job's end),
  recovery/restart.py asks `decide`: the attempt ends StopReason.SDC (a hardware fault:
  a hardware restart, none of max_restarts) and every committed checkpoint newer than the
  last clean comparison is marked CORRUPT ("written after the last clean comparison": the
  corruption may be in it), so the next attempt resumes from the newest one at or before
  that comparison, a state the replicas were seen to agree on. No data is skipped: the
  data was not at fault. The rollback is on the timeline (`run.rolled_back`), in
  `run show`'s rollbacks (kind `sdc`) and in goodput ("rolled back");
- a replica group outvoted by a strict majority of the groups (the report's `outvoted`)
  stops alone: the majority trains on, the group's node is drained and its replacement
  heals from a live group (recovery/fast_path.py); only the checkpoints the outvoted group
  wrote after its last clean comparison are distrusted.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy.orm import Session

from contract import StopReason
from service.config import Settings
from service.models import Attempt, CheckpointState, Incident, Run
from service.models.base import utcnow
from service.recovery import claims
from service.runs import repository
from service.runs.run_state_machine import record_event
from service.worker_protocol.schemas import ErrorReport

REPORT = "worker:sdc"  # the kind the worker reports (worker/reporter.py)
SIGNAL = claims.SDC_SIGNAL  # the incidents' signal, the Slurm drain reason, the alert's label


def note_clean_step(run: Run, step: int | None) -> None:
    """Keep the newest step at which the replicas matched (from a progress report)."""
    if step is not None and step > run.config.get("sdc_clean_step", -1):
        run.config = {**run.config, "sdc_clean_step": step}  # a new dict: the column sees it


def forget_clean_steps_after(run: Run, resume_step: int) -> None:
    """A new attempt starting from `resume_step` (0: from scratch) trains a new timeline
    from there, so a clean comparison the run saw later than that was of the old timeline:
    kept, it would vouch for checkpoints the new one writes up to it, corrupt or not. The
    state at `resume_step` is an ancestor of the one that compared clean (corrupted
    parameters stay corrupted), so it becomes the last clean step."""
    clean = run.config.get("sdc_clean_step")
    if clean is not None and clean > resume_step:
        run.config = {**run.config, "sdc_clean_step": resume_step}


def record_report(
    session: Session, run: Run, attempt: Attempt, report: ErrorReport, settings: Settings
) -> None:
    """A worker's `worker:sdc` report: one drain-and-move incident per odd node, within the
    run's cap on drains its own reports cause (recovery/claims.py); the names are the
    attempt's own nodes (workers/service.py refuses others)."""
    for node in report.nodes:
        claims.drain_claimed(
            session,
            run,
            settings,
            kind="sdc",
            signal=SIGNAL,
            node=node,
            attempt_id=attempt.id,
            message=f"{node}: {SIGNAL}: silent data corruption in run {run.id} at step "
            f"{report.step}: {report.message}"[:2000],
        )


def report_of(session: Session, attempt: Attempt) -> dict[str, Any] | None:
    """The `worker:sdc` report of `attempt`, if its worker sent one."""
    reports = repository.worker_error_reports(session, attempt.id, [REPORT])
    return reports[0] if reports else None


def outvoted_by_majority(session: Session, incident: Incident) -> bool:
    """Whether the `worker:sdc` report behind `incident` came from a replica group that a
    strict majority of the groups outvoted: the majority holds equal copies and trains on,
    and only the outvoted group is replaced, healing from one of them (recovery/
    fast_path.py). Without a majority every group stopped, and the run rolls back."""
    attempt = session.get(Attempt, incident.attempt_id) if incident.attempt_id else None
    report = report_of(session, attempt) if attempt is not None else None
    return bool(report and report.get("outvoted"))


def distrust_checkpoints_of(
    session: Session, run: Run, attempt: Attempt, report: dict[str, Any]
) -> list[int]:
    """An outvoted replica group left while the others train on: the checkpoints it wrote
    after its last clean comparison may hold the corruption (CORRUPT); those the majority
    wrote stand. Returns the steps distrusted."""
    # Its own last clean step only: the majority, which trained on, has since vouched for
    # the step it was outvoted at (note_clean_step), which says nothing of this group.
    return _distrust(session, run, attempt, report, report.get("clean_step"), attempt.id)


def _clean_step(run: Run, report: dict[str, Any]) -> int | None:
    known = [
        s for s in (report.get("clean_step"), run.config.get("sdc_clean_step")) if s is not None
    ]
    return max(known) if known else None


def _distrust(
    session: Session,
    run: Run,
    attempt: Attempt,
    report: dict[str, Any],
    clean: int | None,
    written_by: int | None = None,
) -> list[int]:
    """Mark CORRUPT the committed (or writing) checkpoints after `clean` (all of them when
    None), only those `written_by` that attempt if given."""
    distrusted = []
    for checkpoint in repository.checkpoints(session, run.id):
        later = clean is None or checkpoint.step > clean
        mine = written_by is None or checkpoint.attempt_id == written_by
        live = checkpoint.state in (CheckpointState.COMMITTED, CheckpointState.WRITING)
        if later and mine and live:
            checkpoint.state = CheckpointState.CORRUPT
            checkpoint.corrupt_reason = (
                f"written after the last clean SDC comparison (step {clean}): may hold the "
                f"corruption found at step {report.get('step')}"
                if clean is not None
                else f"no SDC comparison passed before the one at step {report.get('step')}"
            )
            checkpoint.corrupt_at, checkpoint.corrupt_attempt_id = utcnow(), attempt.id
            distrusted.append(checkpoint.step)
    session.flush()
    return distrusted


def decide(
    session: Session, run: Run, attempt: Attempt, report: dict[str, Any], reason: str
) -> tuple[StopReason, str]:
    """StopReason.SDC: checkpoints after the last clean comparison distrusted (CORRUPT), the
    rollback recorded; the next attempt resumes from the newest one left."""
    clean = _clean_step(run, report)
    distrusted = _distrust(session, run, attempt, report, clean)
    newest = repository.newest_committed_checkpoint(session, run.id)
    resume = newest.step if newest is not None else 0
    nodes = [n for n in report.get("nodes") or [] if n in run.nodes]
    row = {
        "kind": "sdc",
        "attempt": attempt.number,
        "anomaly_step": report.get("step"),
        "message": str(report.get("message", ""))[:300],
        "resume_step": resume,
        "clean_step": clean,
        "nodes": nodes,
        "distrusted_checkpoints": distrusted,
    }
    # From the resume point on, only what this run's replicas compare again is known clean.
    run.config = {
        **run.config,
        "rollbacks": [*run.config.get("rollbacks", []), row],
        "sdc_clean_step": resume,
    }
    since = f"step {resume}" if newest is not None else "scratch"
    text = (
        f"silent data corruption at step {report.get('step')} on {', '.join(nodes) or '?'}: "
        f"rolled back to {since} (last clean comparison: step {clean})"
        + (f"; checkpoints {distrusted} distrusted" if distrusted else "")
    )
    record_event(session, run, "run.rolled_back", text, attempt, row)
    return StopReason.SDC, f"{reason}: {text}; nodes drained: one of max_restarts (a claim)"
