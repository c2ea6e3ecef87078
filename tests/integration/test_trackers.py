"""Trackers and notifications on the whole path: a real run on the dev cluster with MLflow
(a real `mlflow server` on Postgres), W&B (offline) and TensorBoard, two nodes lost to
Xid 79, MLflow stopped for 20 s, the service killed twice (mid-delivery and mid-export),
and a webhook receiver that answers 500 three times before it answers 200."""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.engine import make_url

from client.api import RunyardClient
from client.devcluster import postgres
from client.devcluster.mlflow import MlflowServer, backend_store_uri
from service.notifications import render
from service.tracking.tensorboard_sink import read_folder, texts
from service.tracking.wandb_log import read_run
from tests.conftest import TEST_DATABASE_URL, wait_for
from tests.fixtures.trackers import tensorboard_scalars
from tests.fixtures.webhook_receiver import WebhookReceiver
from tests.integration.conftest import (
    Agents,
    ServiceProcess,
    committed,
    free_port,
    tiny_spec,
)
from tests.integration.test_recovery import XID_79

pytestmark = pytest.mark.integration

MLFLOW_PORT = free_port()
EXPORT_ROOT = Path(tempfile.mkdtemp(prefix="runyard-trackers-"))  # the MLflow server's files
# The site's tracker settings for the session's service, and retries fast enough for a
# test. TensorBoard and W&B write into the service's own folder (their defaults).
SITE = {
    "RUNYARD_MLFLOW_TRACKING_URI": f"http://127.0.0.1:{MLFLOW_PORT}",
    "RUNYARD_MLFLOW_REQUEST_TIMEOUT_S": "30",
    "RUNYARD_TRACKING_EXPORT_INTERVAL_S": "0.5",
    "RUNYARD_TRACKING_RETRY_MAX_S": "2",
    "RUNYARD_NOTIFY_INTERVAL_S": "0.2",
    "RUNYARD_NOTIFY_RETRY_BASE_S": "0.5",
    "RUNYARD_NOTIFY_TIMEOUT_S": "2",
}
STEPS = 1500  # at least 90 s of paced steps: two recoveries and an MLflow outage fit
OUTAGE_S = 20.0  # the outage: MLflow stopped for 20 s mid-run


@pytest.fixture(scope="module")
def mlflow_server() -> Iterator[MlflowServer]:
    database = f"{make_url(TEST_DATABASE_URL).database}_mlflow"
    server = MlflowServer(
        port=MLFLOW_PORT,
        store_uri=backend_store_uri(TEST_DATABASE_URL, database),
        artifacts=EXPORT_ROOT / "mlflow-artifacts",
        log=EXPORT_ROOT / "mlflow.out",
    )
    server.start()
    yield server
    server.stop()
    postgres.drop_database(server.store_uri)


@pytest.fixture(scope="module")
def tracker_site(service: ServiceProcess, mlflow_server: MlflowServer) -> Iterator[Path]:
    """The session's service restarted with the site's tracker settings (and restarted
    without them after the module); its own folder, where TensorBoard and W&B write."""
    saved = dict(service.settings)
    service.settings.update(SITE)
    service.stop()
    service.start()
    yield Path(service.settings["RUNYARD_STATE_DIR"]) / "service"
    shutil.copy(service.log, EXPORT_ROOT / "service.log")  # kept after the session
    service.settings.clear()
    service.settings.update(saved)
    service.stop()
    service.start()


@pytest.fixture
def receiver() -> Iterator[WebhookReceiver]:
    hook = WebhookReceiver()
    yield hook
    hook.close()


def final_timeline(client: RunyardClient, run_id: int) -> dict[int, float]:
    """GET /v1/runs/{id}/metrics, each step as its newest attempt trained it."""
    newest: dict[int, dict[str, Any]] = {}
    for row in client.run_metrics(run_id, limit=10000):
        if row["step"] not in newest or row["attempt_id"] > newest[row["step"]]["attempt_id"]:
            newest[row["step"]] = row
    return {step: row["loss"] for step, row in sorted(newest.items())}


def exports(client: RunyardClient, run_id: int) -> dict[str, dict[str, Any]]:
    return {t["tracker"]: t for t in client.run_tracking(run_id)}


def lose_a_node(client: RunyardClient, agents: Agents, run_id: int, number: int) -> str:
    """Xid 79 on one of the run's nodes once it trains past a commit; the next attempt runs."""
    wait_for(
        f"attempt {number} past a commit",
        lambda: past_a_commit(client, run_id, number),
        timeout_s=120,
        context=lambda: situation(client, run_id),
    )
    bad = client.get_run(run_id)["nodes"][-1]
    agents.append(bad, XID_79.format(pid=os.getpid()))
    return bad


def past_a_commit(client: RunyardClient, run_id: int, number: int) -> bool:
    """Attempt `number` committed a checkpoint of its own and trained on from it: its steps
    reported 5 past the newest commit, or three commits made (the service may hear of the
    steps only with the next commit, so the first may never be seen)."""
    attempts = client.get_run(run_id)["attempts"]
    if len(attempts) < number:
        return False
    resumed_at = attempts[number - 1]["resume_step"] or 0
    newest = max(committed(client, run_id), default=0)
    if newest <= resumed_at:
        return False
    return (client.get_run(run_id)["last_step"] or 0) >= newest + 5 or newest >= resumed_at + 60


def situation(client: RunyardClient, run_id: int) -> str:
    """What a timed-out wait prints: the run, its attempts, its newest events, incidents."""
    run = client.get_run(run_id)
    attempts = [(a["number"], a["state"], a["nodes"], a["end_reason"]) for a in run["attempts"]]
    events = [(e["kind"], e["message"][:120]) for e in client.run_events(run_id)][-12:]
    incidents = [
        (i["signal"], i["node_name"], i["state"], i["message"][:80])
        for i in client.list_incidents()
        if i["run_id"] in (run_id, None)
    ][:6]
    state = f"run {run['state']} step {run['last_step']}"
    return f"{state}; attempts {attempts}; events {events}; incidents {incidents}"


def running(client: RunyardClient, run_id: int, number: int) -> bool:
    attempts = client.get_run(run_id)["attempts"]
    return len(attempts) >= number and attempts[number - 1]["state"] == "RUNNING"


def step_times(client: RunyardClient, run_id: int, after: int, through: int) -> list[float]:
    rows = client.run_metrics(run_id, after_step=after, limit=10000)
    return [r["step_time_s"] for r in rows if r["step"] <= through and r["step_time_s"]]


@pytest.mark.timeout(1200)  # two MLflow starts (a minute each on 2 busy cores), 500 steps
def test_trackers_and_notifications_survive_node_losses_outages_and_restarts(
    service: ServiceProcess,
    spare_pool: RunyardClient,
    agents: Agents,
    mlflow_server: MlflowServer,
    tracker_site: Path,
    receiver: WebhookReceiver,
) -> None:
    client = spare_pool
    hook = client.add_notification(receiver.url, ["incident.opened", "run.succeeded"], "json")
    receiver.fail_next = [500, 500, 500]
    tracking = {
        # In the admin team's namespace (ops): ops/... in MLflow, ops-... in W&B.
        "mlflow": {"experiment": "ops/trackers-it"},
        "wandb": {"project": "ops-trackers-it"},
        "tensorboard": True,
    }
    spec = tiny_spec("tracked", steps=STEPS, max_restarts=3, tracking=tracking)
    run_id = client.submit_run(spec)["id"]

    # 1. A node lost; the receiver refuses the news, and the service dies while it does.
    lose_a_node(client, agents, run_id, 1)
    wait_for("the receiver's first refusal", lambda: receiver.answered(500), timeout_s=60)
    service.kill()
    service.start()
    wait_for(
        "attempt 2 running",
        lambda: running(client, run_id, 2),
        timeout_s=180,
        context=lambda: situation(client, run_id),
    )

    # 2. A second node lost.
    lose_a_node(client, agents, run_id, 2)
    wait_for(
        "attempt 3 running",
        lambda: running(client, run_id, 3),
        timeout_s=180,
        context=lambda: situation(client, run_id),
    )
    # 3. MLflow down for 20 s while the run trains: training does not slow down.
    wait_for(
        "MLflow to hold some steps",
        lambda: exports(client, run_id).get("mlflow", {}).get("exported_step", 0) > 0,
        timeout_s=120,
    )
    before_outage = client.get_run(run_id)["last_step"]
    mlflow_server.stop()
    time.sleep(OUTAGE_S)  # the outage itself: a duration, not a condition
    during_outage = client.get_run(run_id)["last_step"]
    stalled_at = exports(client, run_id)["mlflow"]["exported_step"]
    mlflow_server.start()
    # 4. The service killed while the MLflow export catches up.
    wait_for(
        "the MLflow export to move again",
        lambda: exports(client, run_id)["mlflow"]["exported_step"] > stalled_at,
        timeout_s=180,
        interval_s=0.1,
    )
    service.kill()
    service.start()

    wait_for(
        "the run to succeed",
        lambda: client.get_run(run_id)["state"] == "SUCCEEDED",
        timeout_s=300,
        context=lambda: situation(client, run_id),
    )
    wait_for(
        "every tracker's export to finish",
        lambda: {t["state"] for t in exports(client, run_id).values()} == {"FINISHED"},
        timeout_s=300,
        context=lambda: exports(client, run_id),
    )

    # GET /v1/runs/{id}/metrics: every step from 1 to the last.
    expected = final_timeline(client, run_id)
    assert sorted(expected) == list(range(1, STEPS + 1)), "a step without its metric row"
    run = client.get_run(run_id)
    assert len(run["attempts"]) == 3 and run["num_hardware_restarts"] == 2

    # Training's pace during the outage against before it (steps are paced at 60 ms).
    before = step_times(client, run_id, 0, before_outage)
    during = step_times(client, run_id, before_outage, during_outage)
    print(
        f"median step time before the outage {statistics.median(before):.3f} s, during "
        f"{statistics.median(during):.3f} s ({during_outage - before_outage} steps in the outage)"
    )
    assert statistics.median(during) <= 1.25 * statistics.median(before)

    # MLflow: one run, every step's loss once, the recoveries as events, the end.
    from mlflow.tracking import MlflowClient

    mlflow = MlflowClient(mlflow_server.url)
    experiment = mlflow.get_experiment_by_name("ops/trackers-it")
    found = mlflow.search_runs(
        [experiment.experiment_id], filter_string=f"tags.`runyard.run_id` = '{run_id}'"
    )
    assert len(found) == 1, "one MLflow run across three attempts and two service restarts"
    history = mlflow.get_metric_history(found[0].info.run_id, "loss")
    steps = Counter(point.step for point in history)
    print(f"MLflow: {len(history)} loss points, steps {min(steps)}..{max(steps)}")
    assert sorted(steps) == list(range(1, STEPS + 1)) and set(steps.values()) == {1}
    for point in history:
        assert point.value == pytest.approx(expected[point.step], rel=1e-6)
    tags = found[0].data.tags
    recoveries = [
        v for k, v in tags.items() if k.startswith("runyard.event.") and "spare_assigned" in v
    ]
    assert len(recoveries) == 2, tags
    assert (
        tags["runyard.final_state"] == "SUCCEEDED"
        and "runyard run export" in tags["runyard.export_command"]
    )

    # W&B offline, read back from its own records: the same losses, each step once.
    wandb_run = read_run(tracker_site / "wandb" / "ops", f"runyard-{run_id}")
    assert wandb_run.values("loss") == pytest.approx(expected)
    assert wandb_run.rows_logged("loss") == STEPS
    assert sum("spare_assigned" in title for title, _ in wandb_run.alerts) == 2
    assert wandb_run.summary["runyard/final_state"] == "SUCCEEDED"

    # TensorBoard, read back with EventAccumulator: the same losses.
    folder = tracker_site / "tensorboard" / "ops" / f"{run_id}-tracked"
    tb, written = tensorboard_scalars(folder)
    assert sorted(tb) == list(range(1, STEPS + 1)) and set(written.values()) == {1}
    for step, loss in tb.items():
        assert loss == pytest.approx(expected[step], rel=1e-5)  # stored as float32
    events = texts(read_folder(folder), "runyard/events")
    assert sum("spare_assigned" in t for _, t in events) == 2

    # Notifications: each event reached the receiver once it recovered, signed; the
    # service restart in between lost none.
    log = client.notification_deliveries(hook["id"])
    print([(d["event"], d["state"], d["num_tries"], d["last_status"]) for d in log])
    assert {d["state"] for d in log} == {"DELIVERED"}
    events = Counter(d["event"] for d in log)
    assert events["incident.opened"] >= 2 and events["run.succeeded"] == 1
    first = min(log, key=lambda d: d["id"])
    answers = [
        r.status for r in receiver.received if r.headers[render.DELIVERY_HEADER] == str(first["id"])
    ]
    assert answers == [500, 500, 500, 200] and first["last_status"] == 200
    accepted = receiver.answered(200)
    assert {r.headers[render.DELIVERY_HEADER] for r in accepted} == {str(d["id"]) for d in log}
    for request in receiver.received:
        assert render.verify(hook["secret"], request.headers[render.SIGNATURE_HEADER], request.body)
        assert request.json["run"]["id"] == run_id
