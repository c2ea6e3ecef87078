"""The run and attempt state machines record every transition and refuse illegal ones."""

from __future__ import annotations

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Attempt, AttemptState, Run, RunEvent, RunState
from service.runs.run_state_machine import IllegalTransition, set_attempt_state, set_run_state


def make_run(session: Session) -> Run:
    run = Run(
        name="r",
        cluster="default",
        state=RunState.PENDING,
        spec={},
        config={},
        num_nodes=1,
        gpus_per_node=1,
        max_restarts=1,
        total_steps=10,
        attempts=[],
    )
    session.add(run)
    session.flush()
    return run


def test_transitions_are_recorded_with_reason_and_times(db_session: Session) -> None:
    run = make_run(db_session)
    attempt = Attempt(
        run_id=run.id,
        number=1,
        state=AttemptState.SUBMITTING,
        job_name="j",
        job_folder="/tmp",
        cluster="default",
        nodes=[],
    )
    db_session.add(attempt)
    db_session.flush()
    set_attempt_state(db_session, run, attempt, AttemptState.RUNNING)
    set_run_state(db_session, run, RunState.RUNNING, "attempt 1 running", attempt)
    set_attempt_state(db_session, run, attempt, AttemptState.FAILED, "node died", exit_code=1)
    set_run_state(db_session, run, RunState.FAILED, "no restarts left")
    db_session.flush()
    assert run.started_at is not None and run.ended_at is not None
    assert attempt.end_reason == "node died" and attempt.exit_code == 1
    kinds = db_session.scalars(
        select(RunEvent.kind).where(RunEvent.run_id == run.id).order_by(RunEvent.id)
    ).all()
    assert kinds == ["attempt.running", "run.running", "attempt.failed", "run.failed"]


def test_terminal_states_do_not_move(db_session: Session) -> None:
    run = make_run(db_session)
    set_run_state(db_session, run, RunState.CANCELLED, "user")
    with pytest.raises(IllegalTransition):
        set_run_state(db_session, run, RunState.RUNNING, "zombie report")
