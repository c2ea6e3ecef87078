"""A run that survives an Xid 79, as the service handles it and as its user and on-call
see it.

One real run on the dev cluster (its cost is ~1 minute) serves every assertion: the drain
and the move onto the spare with what it cost, the live view on a pseudo-terminal, `run
logs -f` across both attempts, /metrics scraped before and during the recovery, and the
report of the finished run opened in headless Chromium.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from runyard_client.tls import client_context

from client.api import ApiError, RunyardClient
from client.devcluster.cluster import DevCluster
from client.devcluster.render import CLUSTER_NAME  # the ClusterName the node metrics carry
from tests.conftest import REPO_ROOT, wait_for
from tests.fixtures.chromium import loaded_images, screenshot
from tests.fixtures.terminal import Screen, Terminal
from tests.integration.conftest import Agents, ServiceProcess, drain_reason, tiny_spec

# make test-all's (CI): make test's Xid onto a spare is the Trainer's and the site install's
# whole path, `run watch` the Trainer's; the metrics, the report and the log follow are also
# unit-tested (test_alert_rules, test_run_report, test_run_logs). Its one run took 27 s.
pytestmark = pytest.mark.integration

XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=4242, name=python, GPU has fallen off the bus."
STEP = re.compile(r"step (\d+)/200")
RUNYARD = Path(sys.executable).parent / "runyard"  # the installed CLI, as people run it
PHASES = ("detect", "drain", "stop", "resubmit", "start", "first_step", "total")
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(service: ServiceProcess) -> Samples:
    response = httpx.get(
        f"{service.url}/metrics",
        headers={"Authorization": f"Bearer {service.admin_token}"},
        timeout=10,
        verify=client_context(),  # RUNYARD_CA: the dev cluster's CA (slurm_cluster)
    )
    response.raise_for_status()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def recovery_count(samples: Samples, phase: str) -> float:
    return samples.get(("runyard_recovery_duration_seconds_count", (("phase", phase),)), 0.0)


def step_on(screen: Screen) -> int:
    found = STEP.search(screen.text)
    return int(found.group(1)) if found else -1


def bar_filled(screen: Screen) -> int:
    """Cells of the bar drawn in the "done" colour: rich draws the rest of the bar with
    the same character in another colour, so only the colours tell how full it is."""
    line = next((ln for ln in screen.text.splitlines() if STEP.search(ln)), "")
    found = STEP.search(line)
    colours = screen.line_colours(found.group(0) if found else "\0")
    start = next((i for i, ch in enumerate(line) if ch in "━╸"), None)
    if start is None:
        return 0
    done = colours[start]
    filled = 0
    while start + filled < len(line) and line[start + filled] in "━╸":
        if colours[start + filled] != done:
            break
        filled += 1
    return filled


@dataclass
class Observed:
    run_id: int
    failed_node: str
    placed: list[str]  # attempt 1's nodes
    spare: str  # the pool's spare while attempt 1 trained
    drain_reason: str  # Slurm's, for the failed node, once drained
    early: Screen  # the live view some steps into attempt 1
    later: Screen  # ... and a few steps after that
    failure: Screen  # the first screen that showed the Xid
    final_screen: str
    watch_exit: int
    logs_exit: int
    logs: str
    before: Samples  # /metrics before the failure
    during: Samples  # /metrics once the run trains again, before it ends
    final_state: str


@pytest.fixture(scope="module")
def observed(
    service: ServiceProcess,
    agents: Agents,
    slurm_cluster: DevCluster,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Observed]:
    client, conf = service.client(), str(slurm_cluster.slurm_conf)
    client.set_spares(1)
    wait_for("a spare in the pool", lambda: client.get_spares()["members"])
    run_id = client.submit_run(tiny_spec("observed", steps=200))["id"]
    env = {**os.environ, "RUNYARD_URL": service.url, "RUNYARD_TOKEN": service.admin_token}
    runyard = [str(RUNYARD)]
    watch = Terminal([*runyard, "run", "watch", str(run_id), "--interval-s", "0.5"], env)
    logs_file = tmp_path_factory.mktemp("logs") / "follow.out"
    with logs_file.open("wb") as out:
        follow = subprocess.Popen(
            [*runyard, "run", "logs", str(run_id), "-f", "--interval-s", "0.5"],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=REPO_ROOT,
        )
    try:
        early = watch.wait_for("step 10 or more", lambda t: _step(t) >= 10, timeout_s=120)
        later = watch.wait_for(
            "the step 15 past that", lambda t: _step(t) >= _step(early.text) + 15, timeout_s=60
        )
        wait_for("a committed checkpoint", lambda: client.run_checkpoints(run_id))
        before = scrape(service)
        # Read once the run is placed: the service may move its spare before that.
        placed, (spare,) = client.get_run(run_id)["nodes"], client.get_spares()["members"]
        failed_node = placed[1]
        agents.append(failed_node, XID_79)
        failure = watch.wait_for("the Xid 79", lambda t: "xid:79" in t, timeout_s=60)
        drained = wait_for(
            f"{failed_node} drained in Slurm with the Xid in its reason",
            lambda: xid_in(drain_reason(failed_node, conf)),
            timeout_s=30,
        )
        wait_for(
            "the recovery to finish (training again)",
            lambda: any(
                i["state"] == "RESOLVED" for i in client.list_incidents() if i["run_id"] == run_id
            ),
            timeout_s=90,
        )
        during = scrape(service)
        watch_exit = watch.wait_exit(timeout_s=240)
        logs_exit = follow.wait(timeout=60)
        yield Observed(
            run_id=run_id,
            failed_node=failed_node,
            placed=placed,
            spare=spare,
            drain_reason=drained,
            early=early,
            later=later,
            failure=failure,
            final_screen=watch.last,
            watch_exit=watch_exit,
            logs_exit=logs_exit,
            logs=logs_file.read_text(),
            before=before,
            during=during,
            final_state=client.get_run(run_id)["state"],
        )
    finally:
        watch.close()
        if follow.poll() is None:
            follow.kill()
        _return_nodes(client)


def xid_in(reason: str) -> str | None:
    return reason if "xid:79" in reason else None


def _step(text: str) -> int:
    found = STEP.search(text)
    return int(found.group(1)) if found else -1


def _return_nodes(client: RunyardClient) -> None:
    """Give the drained node back; the session's clean-up resumes it in Slurm if this fails
    (another test session on the same dev cluster may have resumed it first)."""
    client.set_spares(0)
    for node in client.list_nodes():
        if node["state"] in ("DRAINED", "DRAINING"):
            try:
                client.resume_node(node["name"])
            except ApiError as exc:
                print(f"could not resume {node['name']}: {exc.message}")


def test_the_xid_drains_the_node_and_the_spare_takes_over(
    observed: Observed, service: ServiceProcess
) -> None:
    client, bad, spare = service.client(), observed.failed_node, observed.spare
    assert len(observed.placed) == 2 and spare not in observed.placed
    assert "xid:79" in observed.drain_reason
    final = client.get_run(observed.run_id)
    assert final["state"] == "SUCCEEDED", final["state_reason"]
    first, second = final["attempts"]
    assert sorted(first["nodes"]) == sorted(observed.placed)
    # Attempt 2 on the healthy node and the spare, from the newest checkpoint committed
    # before it was submitted.
    healthy = [n for n in observed.placed if n != bad]
    assert sorted(second["nodes"]) == sorted([*healthy, spare])
    submitted = datetime.fromisoformat(second["submitted_at"])
    newest = max(
        c["step"]
        for c in client.run_checkpoints(observed.run_id)
        if c["committed_at"] and datetime.fromisoformat(c["committed_at"]) < submitted
    )
    assert second["resume_step"] == newest
    assert final["num_hardware_restarts"] == 1 and final["num_restarts"] == 1
    assert client.get_node(bad)["state"] == "DRAINED"

    incident = next(i for i in client.list_incidents() if i["run_id"] == observed.run_id)
    assert incident["signal"] == "xid:79" and incident["node_name"] == bad
    assert incident["spare_node"] == spare
    assert incident["state"] == "RESOLVED" and incident["recovery_s"] is not None
    for stamp in ("drained_at", "attempt_ended_at", "submitted_at", "running_at", "first_step_at"):
        assert incident[stamp], stamp
    print(f"recovery: signal -> first resumed step {incident['recovery_s']:.1f} s")

    goodput = final["goodput"]
    assert 0 < goodput["goodput"] < 1
    lost = goodput["lost"]
    assert lost["recomputed_steps_s"] + lost["detection_s"] > 0
    assert lost["drain_and_resubmit_s"] > 0 and lost["startup_and_load_s"] > 0
    kinds = [e["kind"] for e in client.run_events(observed.run_id)]
    assert "recovery.spare_assigned" in kinds


def test_watch_shows_the_bar_move_and_the_failure(observed: Observed) -> None:
    assert step_on(observed.later) > step_on(observed.early)
    assert bar_filled(observed.later) > bar_filled(observed.early)  # the bar itself grew
    assert "ETA" in observed.early.text and "MFU" in observed.early.text
    assert "attempt 1 RUNNING" in observed.early.text
    assert observed.failed_node in observed.failure.text
    assert "step 200/200" in observed.final_screen and "SUCCEEDED" in observed.final_screen
    assert observed.watch_exit == 0 and observed.final_state == "SUCCEEDED"


def test_metrics_show_the_recovery_while_it_happens(observed: Observed) -> None:
    before, during = observed.before, observed.during
    for phase in PHASES:
        assert recovery_count(during, phase) == recovery_count(before, phase) + 1, phase
    xid = (
        "runyard_node_events_total",
        (("action", "DRAIN_AND_MOVE"), ("cluster", CLUSTER_NAME), ("code", "79"), ("kind", "xid")),
    )
    assert during[xid] == before.get(xid, 0.0) + 1
    assert during[("runyard_runs", (("state", "RUNNING"),))] >= 1
    # Over all running runs, naming none (/metrics answers without a token).
    assert during[("runyard_running_mfu_ratio", ())] > 0
    assert ("runyard_runs_below_goodput_budget", ()) in during
    assert not any(dict(labels).keys() & {"run_id", "run_name"} for _, labels in during)
    assert during[("runyard_nodes", (("cluster", CLUSTER_NAME), ("state", "DRAINED")))] >= 1
    assert during[("runyard_database_up", ())] == 1


def test_logs_follow_the_run_across_attempts(observed: Observed) -> None:
    assert observed.logs_exit == 0
    text = observed.logs
    first = text.index(f"==> run {observed.run_id} attempt 1 rank 0 <==")
    second = text.index(f"==> run {observed.run_id} attempt 2 rank 0 <==")
    assert first < second
    assert "step 1/200" in text[first:second]
    assert "step 200/200" in text[second:]


def test_report_of_the_recovered_run_loads_in_chromium(
    observed: Observed, service: ServiceProcess, tmp_path: Path
) -> None:
    out = tmp_path / "report"
    result = subprocess.run(
        [str(RUNYARD), "run", "report", str(observed.run_id), "--out", str(out)],
        capture_output=True,
        text=True,
        env={**os.environ, "RUNYARD_URL": service.url, "RUNYARD_TOKEN": service.admin_token},
        timeout=120,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    page = out / "report.html"
    html = page.read_text()
    assert "xid:79" in html and observed.failed_node in html and "SUCCEEDED" in html
    images = loaded_images(page)
    assert len(images) == 4
    assert all(i.complete and i.width > 0 and i.height > 0 for i in images), images
    shot = screenshot(page, out / "screenshot.png")
    keep = os.environ.get("RUNYARD_TEST_ARTIFACTS")
    if keep:  # for a person to look at: the page and what Chromium showed
        shutil.copytree(out, Path(keep) / "report", dirs_exist_ok=True)
    assert shot.stat().st_size > 50_000
