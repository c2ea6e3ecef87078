"""`runyard notify ...`: your team's webhooks (JSON or Slack) and their delivery log."""

from __future__ import annotations

import typer

from client.commands.common import call
from client.output import Exit, console, fail, hint, print_json, print_table, short_time

app = typer.Typer(
    help="Notifications: webhooks and Slack for your team's runs.", no_args_is_help=True
)

EVENTS = ("run.failed", "run.succeeded", "run.moved", "incident.opened", "rollback", "goodput.low")
JSON = typer.Option(False, "--json", help="Print JSON for scripts.")


@app.command()
def add(
    url: str = typer.Option(..., "--url", help="Your receiver, or a Slack incoming-webhook URL."),
    events: str = typer.Option(
        ",".join(EVENTS), "--events", help="Comma-separated: " + ", ".join(EVENTS) + "."
    ),
    format: str = typer.Option("json", "--format", help="json (the event) or slack (a message)."),
    json: bool = JSON,
) -> None:
    """Send your team's run events to URL, signed (X-Runyard-Signature, HMAC-SHA256)."""
    wanted = [e.strip() for e in events.split(",") if e.strip()]
    unknown = [e for e in wanted if e not in EVENTS]
    if unknown or not wanted:
        fail(
            f"--events: unknown {', '.join(unknown) or 'none given'}; use {','.join(EVENTS)}",
            Exit.USAGE,
        )
    if format not in ("json", "slack"):
        fail(f"--format: {format!r} is neither json nor slack", Exit.USAGE)
    created = call(lambda c: c.add_notification(url, wanted, format))
    if json:
        return print_json(created)
    what = ", ".join(created["events"])
    console.print(
        f"notification {created['id']} for team {created['team']}: {what} -> {created['url']}"
    )
    console.print(f"signing secret (shown once): {created['secret']}", highlight=False)
    hint(f"runyard notify test {created['id']}, then runyard notify log --id {created['id']}")


@app.command("list")
def list_(json: bool = JSON) -> None:
    """Your team's notifications."""
    rows = call(lambda c: c.list_notifications())
    if json:
        return print_json(rows)
    print_table(
        None,
        ["ID", "TEAM", "OWNER", "FORMAT", "EVENTS", "URL"],
        [
            (s["id"], s["team"], s["owner"], s["format"], ",".join(s["events"]), s["url"])
            for s in rows
        ],
    )


@app.command()
def remove(subscription_id: int) -> None:
    """Stop a notification (its delivery log stays)."""
    call(lambda c: c.remove_notification(subscription_id))
    console.print(f"notification {subscription_id} removed")


@app.command()
def test(subscription_id: int) -> None:
    """Send a test event through the whole path (outbox, retries, signature)."""
    call(lambda c: c.test_notification(subscription_id))
    console.print(f"test event queued for notification {subscription_id}")
    hint(f"runyard notify log --id {subscription_id}")


@app.command()
def log(
    subscription_id: int | None = typer.Option(None, "--id", help="One notification's deliveries."),
    limit: int = typer.Option(50, help="Newest first, at most this many."),
    json: bool = JSON,
) -> None:
    """Deliveries, newest first: the event, its tries, the receiver's last answer."""
    rows = call(lambda c: c.notification_deliveries(subscription_id, limit))
    if json:
        return print_json(rows)
    print_table(
        None,
        [
            "DELIVERY",
            "ID",
            "EVENT",
            "RUN",
            "STATE",
            "TRIES",
            "LAST STATUS",
            "CREATED",
            "DELIVERED",
            "LAST ERROR",
        ],
        [
            (
                d["id"],
                d["subscription_id"],
                d["event"],
                d["run_id"],
                d["state"],
                d["num_tries"],
                d["last_status"],
                short_time(d["created_at"]),
                short_time(d["delivered_at"]),
                (d["last_error"] or "")[:60],
            )
            for d in rows
        ],
    )
