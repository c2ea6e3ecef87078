"""goodput.low: a running run keeps less of its GPU time productive than its plan expected.

The same judgement as the RunyardGoodputLow alert (deploy/prometheus/runyard-rules.yml):
goodput below the plan's, once the run has held its nodes for goodput_low_after_s
(start-up counts as lost time, so every run starts "low"). Told once per run, through the
notifications' outbox; judged every minute by the delivery thread
(service/notifications/delivery_loop.py, which service/integrations.py hands this judge).
"""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.config import Settings
from service.models import Attempt, NotificationEvent, NotificationSubscription, Run, RunState
from service.notifications.outbox import enqueue, run_payload
from service.runs.goodput import compute_goodput
from service.runs.repository import checkpoints


def enqueue_low_goodput(session: Session, settings: Settings) -> int:
    """Queue goodput.low for the running runs below plan whose team subscribed to it."""
    teams = set(
        session.scalars(
            select(NotificationSubscription.team).where(
                NotificationSubscription.removed_at.is_(None),
                NotificationSubscription.events.contains([NotificationEvent.GOODPUT_LOW.value]),
            )
        ).all()
    )
    if not teams:
        return 0
    queued = 0
    runs = session.scalars(
        select(Run).where(Run.state == RunState.RUNNING, Run.team.in_(teams)).order_by(Run.id)
    ).all()
    for run in runs:
        budget = (run.config.get("plan") or {}).get("goodput")
        if budget is None:
            continue
        attempts = session.scalars(
            select(Attempt).where(Attempt.run_id == run.id).order_by(Attempt.number)
        ).all()
        figures = compute_goodput(run, attempts, checkpoints(session, run.id))
        if figures.goodput is None or figures.allocated_s < settings.goodput_low_after_s:
            continue
        if figures.goodput >= float(budget):
            continue
        lost = figures.lost.model_dump()
        worst = max(lost, key=lambda cause: lost[cause])
        what = (
            f"goodput {figures.goodput:.1%} against the plan's {float(budget):.1%} after "
            f"{figures.allocated_s / 3600:.1f} h; most lost to {worst} ({lost[worst]:.0f} s)"
        )
        payload = run_payload(
            run,
            NotificationEvent.GOODPUT_LOW,
            what,
            reason=worst,
            goodput=figures.goodput,
            budget=float(budget),
        )
        key = f"{NotificationEvent.GOODPUT_LOW.value}:{run.id}"
        queued += enqueue(session, run.team, NotificationEvent.GOODPUT_LOW, key, payload, run.id)
    return queued
