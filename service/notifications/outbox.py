"""The outbox: one delivery row per subscriber, written in the transaction that recorded
the event, so an event that happened is an event that will be delivered (and one that was
rolled back never is), whatever happens to the process before it is sent.

Called from the two places events are made: the run timeline
(service/runs/run_state_machine.py::record_event) and a new incident
(service/recovery/signals.py::open_incident); goodput.low from its watcher. The payload is
everything a receiver needs, fixed at the time of the event (service/notifications/render.py
turns it into JSON or a Slack message when it is sent).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from service.models import (
    Incident,
    NotificationDelivery,
    NotificationEvent,
    NotificationSubscription,
    Run,
    RunState,
)
from service.models.base import utcnow

# The timeline entries a team can subscribe to, by the kind record_event gives them.
EVENT_OF_RUN_EVENT: dict[str, NotificationEvent] = {
    "run.failed": NotificationEvent.RUN_FAILED,
    "run.succeeded": NotificationEvent.RUN_SUCCEEDED,
    "recovery.spare_assigned": NotificationEvent.RUN_MOVED,
    "run.rolled_back": NotificationEvent.ROLLBACK,
}


def run_look_command(run_id: int) -> str:
    return f"runyard run show {run_id}"


def run_payload(run: Run, event: NotificationEvent, what: str, **fields: Any) -> dict[str, Any]:
    """The event as receivers get it (the JSON format; Slack's message is made from it)."""
    return {
        "event": event.value,
        "at": utcnow().isoformat(),
        "team": run.team,
        "run": {
            "id": run.id,
            "name": run.name,
            "owner": run.owner,
            "state": run.state.value,
            "step": run.last_step,
            "total_steps": run.total_steps,
        },
        "what": what,
        "node": fields.pop("node", None),
        "reason": fields.pop("reason", None),
        "look": run_look_command(run.id),
        **fields,
    }


def enqueue(
    session: Session,
    team: str,
    event: NotificationEvent,
    dedupe_key: str,
    payload: dict[str, Any],
    run_id: int | None = None,
    only_subscription: int | None = None,
) -> int:
    """A delivery for each of `team`'s live subscriptions to `event` (or for one), once per
    `dedupe_key`; how many were queued."""
    query = select(NotificationSubscription.id).where(
        NotificationSubscription.team == team,
        NotificationSubscription.removed_at.is_(None),
    )
    if only_subscription is not None:
        query = query.where(NotificationSubscription.id == only_subscription)
    else:
        query = query.where(NotificationSubscription.events.contains([event.value]))
    subscribers = session.scalars(query).all()
    if not subscribers:
        return 0
    now = utcnow()
    rows = [
        {
            "subscription_id": sid,
            "team": team,
            "run_id": run_id,
            "event": event,
            "dedupe_key": dedupe_key[:128],
            "payload": payload,
            "created_at": now,
            "next_try_at": now,
            "state": "PENDING",
            "num_tries": 0,
        }
        for sid in subscribers
    ]
    stmt = insert(NotificationDelivery).values(rows)
    session.execute(stmt.on_conflict_do_nothing(index_elements=["subscription_id", "dedupe_key"]))
    return len(rows)


def on_run_event(
    session: Session,
    run: Run,
    kind: str,
    message: str,
    attempt_id: int | None,
    data: dict[str, Any],
) -> None:
    """A timeline entry: queued for its subscribers if it is one a team can subscribe to."""
    event = EVENT_OF_RUN_EVENT.get(kind)
    if event is None or not run.team:
        return
    if event in (NotificationEvent.RUN_FAILED, NotificationEvent.RUN_SUCCEEDED):
        key = f"{event.value}:{run.id}"  # a run ends once
        fields: dict[str, Any] = {"reason": message}
    elif event == NotificationEvent.RUN_MOVED:
        key = f"{event.value}:{run.id}:{data.get('incident')}"
        fields = {"node": data.get("failed"), "spare": data.get("spare")}
    else:  # ROLLBACK
        key = f"{event.value}:{run.id}:{attempt_id}"
        nodes = data.get("nodes") or []
        fields = {
            "node": ", ".join(nodes) or None,
            "reason": data.get("message"),
            "step": data.get("anomaly_step"),
            "resume_step": data.get("resume_step"),
        }
    payload = run_payload(run, event, message, **fields)
    if event == NotificationEvent.RUN_FAILED:  # the state it ends in, not the one before
        payload["run"]["state"] = RunState.FAILED.value
    enqueue(session, run.team, event, key, payload, run_id=run.id)


def on_incident_opened(session: Session, incident: Incident) -> None:
    """A failure runyard acts on: queued for the teams whose runs it touches (the incident's
    run, or the live runs holding its node)."""
    if incident.run_id is not None:
        runs = [session.get(Run, incident.run_id)]
    elif incident.node_name is not None:
        live = (RunState.PENDING, RunState.RUNNING)
        runs = list(
            session.scalars(
                select(Run).where(
                    Run.cluster == incident.cluster,
                    Run.state.in_(live),
                    Run.nodes.contains([incident.node_name]),
                )
            ).all()
        )
    else:
        runs = []
    for run in runs:
        if run is None or not run.team:
            continue
        payload = run_payload(
            run,
            NotificationEvent.INCIDENT_OPENED,
            incident.message,
            node=incident.node_name,
            reason=incident.signal,
            action=incident.action.value,
            incident_id=incident.id,
        )
        key = f"{NotificationEvent.INCIDENT_OPENED.value}:{incident.id}:{run.id}"
        enqueue(session, run.team, NotificationEvent.INCIDENT_OPENED, key, payload, run.id)
