"""A prod run takes the nodes of a scavenger run, which checkpoints, yields, and later
resumes from that checkpoint on the same loss curve as an uninterrupted twin (the prod run
itself: the same spec at another priority)."""

from __future__ import annotations

from datetime import datetime

import pytest

from client.api import RunyardClient
from tests.conftest import wait_for
from tests.integration.conftest import (
    Agents,
    ServiceProcess,
    inject_faults,
    losses,
    other_work,
    slurm,
    tiny_spec,
)

pytestmark = pytest.mark.integration

# The segmented run's 200 steps take at least 20 s, whatever the machine: more than one
# 15 s segment (the tests' service stops a 1-minute run 45 s before its limit).
inject_faults("pace_step:1:*@segmented=0.1")


def succeeded(client: RunyardClient, run_id: int) -> bool:
    state = client.get_run(run_id)["state"]
    assert state not in ("FAILED", "CANCELLED"), client.get_run(run_id)["state_reason"]
    return state == "SUCCEEDED"


@pytest.mark.whole_path
@pytest.mark.every_slurm
def test_prod_run_preempts_a_scavenger_run(
    service: ServiceProcess, agents: Agents, slurm_cluster
) -> None:
    client, conf = service.client(), str(slurm_cluster.slurm_conf)
    client.set_spares(0)
    # No checkpoint on a cadence before the end: the only one the scavenger can have when
    # it stops is the yield's own, taken at the step it stopped (without it, the steps
    # trained since the last commit would be lost; a stop seen on a cadence step would not
    # tell the two apart).
    # 240 steps, 210 of them after the wait below: at the 0.06 s pace floor 12.6 s for the
    # prod run to be placed and the stop to arrive. With 160 steps and 115 after the wait,
    # a fast machine's scavenger trained its last step before the stop came (2026-12-07).
    spec = tiny_spec("scavenger", steps=240, priority="scavenger", checkpoint_every=240)

    # Other work holds every node but two: the scavenger run takes all the free ones; it
    # runs first, and only then is the scavenger placed on what is left.
    with other_work(conf, leave_idle=2):
        scavenger = client.submit_run(spec)["id"]
        wait_for(
            "the scavenger training",
            lambda: (client.get_run(scavenger)["last_step"] or 0) >= 30,
            timeout_s=180,  # Slurm may take a scheduling cycle to start it beside the blocker
        )
        assert not client.run_checkpoints(scavenger), "no checkpoint before the yield"
        # No node left free: the prod run can start only on the scavenger's nodes.
        free = slurm("sinfo", "-h", "-N", "-t", "idle", "-o", "%N", conf=conf).split()
        assert free == [], f"{free} idle: the prod run would not need to preempt"
        # The prod run is the scavenger's uninterrupted twin: the same spec (seed, data,
        # schedule) at another priority, so its losses are what the scavenger's must be.
        prod = client.submit_run({**spec, "name": "prod", "priority": "prod"})["id"]

        stopped = wait_for(
            "the scavenger to yield",
            lambda: next(
                (a for a in client.get_run(scavenger)["attempts"] if a["state"] == "STOPPED"), None
            ),
            timeout_s=60,
        )
        assert (stopped["stop_reason"], stopped["stopped_for_run_id"]) == ("preempted", prod)
        assert f"preempted by run {prod}" in stopped["end_reason"]
        asked = next(
            e for e in client.run_events(scavenger) if e["kind"] == "attempt.stop_requested"
        )
        kept = [c for c in client.run_checkpoints(scavenger) if c["committed_at"]]
        assert kept, "the scavenger stopped without a checkpoint: its steps are lost"
        yielded = max(kept, key=lambda c: c["step"])
        assert yielded["step"] < spec["steps"], "the scavenger ended before the stop came"
        # The yield is a checkpoint of its own, taken once the stop was asked for, at the
        # step the scavenger stopped: nothing it trained is lost. (How fast is measured by
        # bench/, not bounded here.)
        latency = (
            datetime.fromisoformat(yielded["committed_at"])
            - datetime.fromisoformat(asked["created_at"])
        ).total_seconds()
        assert latency > 0, (yielded, asked)
        assert yielded["step"] == max(losses(client, scavenger, stopped["id"])), yielded
        print(
            f"yield: stop asked -> checkpoint committed in {latency:.2f} s "
            f"at step {yielded['step']}"
        )

        wait_for("the prod run to succeed", lambda: succeeded(client, prod), timeout_s=180)
        assert set(client.get_run(prod)["attempts"][0]["nodes"]) & set(stopped["nodes"])
        assert len(client.get_run(prod)["attempts"]) == 1, "the twin trained uninterrupted"
        twin = losses(client, prod)

    wait_for("the scavenger to finish", lambda: succeeded(client, scavenger), timeout_s=180)
    final = client.get_run(scavenger)
    resumed = final["attempts"][-1]
    assert resumed["resume_step"] == yielded["step"]
    assert final["num_restarts"] == 0, "a preemption is not a failure"
    after = losses(client, scavenger, resumed["id"])
    assert min(after) == yielded["step"] + 1
    for step, loss in after.items():
        assert loss == pytest.approx(twin[step], rel=1e-4), f"step {step}"
    assert final["goodput"]["lost"]["preempted_s"] > 0
    kinds = [e["kind"] for e in client.run_events(prod)]
    assert "run.preempting" in kinds


@pytest.mark.whole_path
@pytest.mark.every_slurm
def test_a_run_longer_than_its_time_limit_runs_as_segments(
    service: ServiceProcess, agents: Agents
) -> None:
    client = service.client()
    run_id = client.submit_run(tiny_spec("segmented", steps=200, time_limit_min=1))["id"]
    wait_for("the run to finish", lambda: succeeded(client, run_id), timeout_s=240)
    final = client.get_run(run_id)
    stopped = [a for a in final["attempts"] if a["state"] == "STOPPED"]
    assert stopped and all(a["stop_reason"] == "time_limit" for a in stopped)
    assert all("segment time limit" in a["end_reason"] for a in stopped)
    assert final["num_restarts"] == 0, "a segment boundary is not a failure"
    for before, after in zip(final["attempts"], final["attempts"][1:], strict=False):
        assert after["resume_step"] is not None and after["resume_step"] > (
            before["resume_step"] or 0
        )
    steps = sorted({m["step"] for m in client.run_metrics(run_id)})
    assert steps == list(range(1, 201)), "every step trained exactly once across segments"
    assert final["goodput"]["lost"]["segment_boundaries_s"] > 0
    kinds = [e["kind"] for e in client.run_events(run_id)]
    # The last segment may be asked to stop as it finishes its final step: it then succeeds.
    assert kinds.count("attempt.stop_requested") in (len(stopped), len(stopped) + 1)
