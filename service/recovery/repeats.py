"""Restart loops: the same failure at the same step after a restart is deterministic.

A rank that fails reports why before it exits (worker/entry.py, POST .../errors): the
exception's text and the step it happened at (`worker:exception`), or the checkpoint it
failed to load (`worker:checkpoint_load`). Two attempts in a row that ended with the same
signature (kind, step, and the text with its numbers and addresses blanked, so "pid 4711"
and "pid 4712" match) failed for a reason another attempt will not change: a bug, bad data,
a checkpoint that cannot be read. Hardware failures and collective errors (a peer died)
have no signature: they are bad luck, retried within max_restarts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.models import Attempt
from service.runs import repository

# The worker's kinds that carry a signature (service/worker_protocol/schemas.py ErrorReport).
EXCEPTION = "worker:exception"
CHECKPOINT_LOAD = "worker:checkpoint_load"
_NUMBERS = re.compile(r"0x[0-9a-fA-F]+|\d+")


@dataclass(frozen=True)
class Signature:
    kind: str  # EXCEPTION or CHECKPOINT_LOAD
    step: int  # the step it failed at, or the checkpoint's step it failed to load
    text: str  # the exception's text, numbers blanked
    message: str = field(compare=False, default="")  # as the rank reported it

    def describe(self) -> str:
        where = f"loading the checkpoint at step {self.step}" if self.loads else f"step {self.step}"
        return f"{(self.message or self.text)[:300]} (at {where})"

    @property
    def loads(self) -> bool:
        return self.kind == CHECKPOINT_LOAD


def signature(session: Session, attempt: Attempt) -> Signature | None:
    """What `attempt` failed with, from its ranks' reports: the earliest step any rank
    reported (a rank that failed later only followed it); None without such a report."""
    reports = repository.worker_error_reports(session, attempt.id, [EXCEPTION, CHECKPOINT_LOAD])
    found = [
        Signature(
            r["kind"], r["step"], _NUMBERS.sub("#", r.get("message", "")), r.get("message", "")
        )
        for r in reports
        if r.get("step") is not None
    ]
    return min(found, key=lambda s: (s.step, s.kind, s.text)) if found else None


def previous_attempt(session: Session, attempt: Attempt) -> Attempt | None:
    return session.scalars(
        select(Attempt).where(
            Attempt.run_id == attempt.run_id, Attempt.number == attempt.number - 1
        )
    ).one_or_none()


def repeated(session: Session, attempt: Attempt) -> Signature | None:
    """The signature `attempt` failed with, if the attempt before it failed the same way."""
    mine = signature(session, attempt)
    before = previous_attempt(session, attempt)
    if mine is None or before is None:
        return None
    return mine if signature(session, before) == mine else None
