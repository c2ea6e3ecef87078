"""Your own training script survives a GPU failure like runyard's trainer: the example DDP
script (examples/ddp_train.py) runs on two nodes of the dev cluster, one node logs Xid 79,
the node is drained, a spare takes its place and the script resumes from its own newest
committed checkpoint (a torch.save file it registered through worker/client.py). Asked to
stop at a segment's time limit, it learns so from the client, saves and exits at the same
step on every rank."""

from __future__ import annotations

from pathlib import Path

import pytest

from client.api import RunyardClient
from tests.conftest import wait_for
from tests.integration.conftest import (
    Agents,
    ServiceProcess,
    committed,
    lose_a_node_and_resume,
    tiny_spec,
)

pytestmark = pytest.mark.integration

REPO_ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.timeout(600)
def test_an_entrypoint_script_resumes_on_a_spare_from_its_own_checkpoint(
    spare_pool: RunyardClient, agents: Agents, slurm_cluster
) -> None:
    client, conf = spare_pool, str(slurm_cluster.slurm_conf)
    script = str(REPO_ROOT / "examples" / "ddp_train.py")
    args = ["--checkpoint-every", "10", "--width", "32", "--batch-size", "8"]
    spec = tiny_spec("own-script-xid", steps=120, entrypoint={"script": script, "args": args})
    run_id = client.submit_run(spec)["id"]
    moved = lose_a_node_and_resume(client, run_id, agents, conf)
    resume_step = moved.resume_step
    assert resume_step % 10 == 0  # the script's own cadence

    wait_for(
        "the run to succeed", lambda: client.get_run(run_id)["state"] == "SUCCEEDED", timeout_s=240
    )
    final = client.get_run(run_id)
    assert final["num_hardware_restarts"] == 1 and final["last_step"] == 120
    log = client.run_logs(run_id, attempt=2, rank=0)["text"]
    assert f"step_{resume_step:08d}.pt at step {resume_step}" in log, log[-2000:]
    steps = [m["step"] for m in client.run_metrics(run_id, after_step=resume_step)]
    assert min(steps) == resume_step + 1  # the script went on from there, not from 0
    # The Xid's cost, each part where it belongs, as for runyard's own trainer: the steps
    # after the resumed checkpoint (trained twice, or lost while undetected), the drain and
    # resubmission, the new attempt's start and checkpoint load; the rest was productive.
    goodput = final["goodput"]
    lost = goodput["lost"]
    assert 0 < goodput["goodput"] < 1, goodput
    assert lost["recomputed_steps_s"] + lost["detection_s"] > 0, lost
    assert lost["drain_and_resubmit_s"] > 0 and lost["startup_and_load_s"] > 0, lost
    assert goodput["productive_s"] == pytest.approx(
        goodput["allocated_s"] - sum(lost.values()), abs=0.01
    ), goodput


@pytest.mark.timeout(600)
def test_a_script_longer_than_its_time_limit_runs_as_segments(service: ServiceProcess) -> None:
    """Before its 1-minute segment ends the service asks the run to stop; the script sees
    `should_stop`, checkpoints its last step on every rank's agreement and exits 0, and the
    next segment resumes there: no step lost, none trained twice."""
    client = service.client()
    script = str(REPO_ROOT / "examples" / "ddp_train.py")
    args = ["--checkpoint-every", "100000", "--width", "32", "--batch-size", "8"]
    spec = tiny_spec("own-script-segments", steps=100000, time_limit_min=1,
                     entrypoint={"script": script, "args": args})  # fmt: skip
    run_id = client.submit_run(spec)["id"]
    second = wait_for(
        "the second segment training",
        lambda: next((a for a in client.get_run(run_id)["attempts"][1:]
                      if a["first_step"] is not None), None),
        timeout_s=300,
    )  # fmt: skip
    client.cancel_run(run_id)
    first = client.get_run(run_id)["attempts"][0]
    assert first["state"] == "STOPPED" and first["stop_reason"] == "time_limit", first
    stop_step = second["resume_step"]
    assert stop_step > 0 and committed(client, run_id)[0] == stop_step  # the stop's own save
    metrics = client.run_metrics(run_id, limit=10_000)  # the API's largest page
    before = sorted(m["step"] for m in metrics if m["attempt_id"] == first["id"])
    after = sorted(m["step"] for m in metrics if m["attempt_id"] == second["id"])
    assert before == list(range(1, stop_step + 1))
    assert after and after[0] == stop_step + 1
