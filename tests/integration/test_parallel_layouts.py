"""Pinned parallel layouts through the real service and Slurm, and a layout change across a
resume: a run that loses a node with no spare left shrinks, and its FSDP checkpoint from 4
ranks reshards onto the 2 that remain, retracing the same losses.

The numerics of every layout against a single-process reference are checked under torchrun
in tests/unit/worker/test_worker_layouts.py; here the point is the whole path: the spec's
`parallelism`, resolve, the planner's admission, sbatch, the ranks' meshes, checkpoints.
"""

from __future__ import annotations

from typing import Any

import pytest

from client.api import RunyardClient
from tests.conftest import TEST_DATABASE, wait_for
from tests.integration.conftest import Agents, ServiceProcess, slurm, tiny_spec

pytestmark = pytest.mark.integration

XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, name=python, GPU has fallen off the bus."


def committed(client: RunyardClient, run_id: int) -> list[int]:
    return [c["step"] for c in client.run_checkpoints(run_id) if c["state"] == "COMMITTED"]


def losses_by_attempt(client: RunyardClient, run_id: int) -> dict[int, dict[int, float]]:
    found: dict[int, dict[int, float]] = {}
    for row in client.run_metrics(run_id, after_step=-1, limit=10_000):
        found.setdefault(row["attempt_id"], {})[row["step"]] = row["loss"]
    return found


@pytest.mark.parametrize(
    ("name", "cluster", "parallelism", "layout"),
    [
        # Tensor (and sequence) parallel between the 2 ranks of one node.
        ("tp2", {"nodes": 1, "gpus_per_node": 2}, {"dp": 1, "tp": 2}, {"tp": 2, "dp": 1}),
        # Two pipeline stages on two nodes, 1F1B over 2 micro batches.
        ("pp2", {"nodes": 2, "gpus_per_node": 1}, {"pp": 2}, {"pp": 2, "dp": 1}),
        # FSDP (ZeRO-3) over 2 nodes x 2 ranks.
        ("fsdp4", {"nodes": 2, "gpus_per_node": 2}, {"zero_stage": 3},
         {"dp": 4, "zero_stage": 3}),
        # Context parallel over 2 ranks, data parallel over the 2 nodes.
        ("cp2xdp2", {"nodes": 2, "gpus_per_node": 2}, {"cp": 2}, {"cp": 2, "dp": 2}),
    ],
)  # fmt: skip
def test_a_pinned_layout_trains_to_the_end(
    service: ServiceProcess,
    name: str,
    cluster: dict[str, int],
    parallelism: dict[str, Any],
    layout: dict[str, int],
) -> None:
    client = service.client()
    spec = tiny_spec(
        f"layout-{name}",
        model="tiny",  # two blocks: pp2 puts one on each stage
        steps=24,
        checkpoint_every=8,
        parallelism=parallelism,
        **cluster,
    )
    run = client.submit_run(spec)
    for field, value in layout.items():
        assert run["layout"][field] == value, (field, run["layout"])
    wait_for(
        f"the {name} run to succeed",
        lambda: client.get_run(run["id"])["state"] in ("SUCCEEDED", "FAILED"),
        timeout_s=300,
        context=lambda: [e["message"] for e in client.run_events(run["id"])][-8:],
    )
    final = client.get_run(run["id"])
    assert final["state"] == "SUCCEEDED", final["state_reason"]
    assert committed(client, run["id"])[-2:] == [16, 24]
    (steps,) = losses_by_attempt(client, run["id"]).values()
    assert sorted(steps) == list(range(1, 25))
    assert steps[24] < steps[1] - 1.0  # it learned: from ln(256) = 5.5 toward ~3


def test_a_run_that_loses_a_node_without_a_spare_continues_on_fewer_ranks(
    service: ServiceProcess, agents: Agents, slurm_cluster: Any
) -> None:
    """FSDP over 2 nodes x 2 ranks; a node's GPU falls off the bus; no spare, no free node;
    min_nodes 1 lets the run continue on the healthy node: dp 2, resuming from the
    4-rank checkpoint. Steps trained by both attempts must give the same loss."""
    client, conf = service.client(), str(slurm_cluster.slurm_conf)
    client.set_spares(0)
    # Checkpoints far enough apart that the kill lands between two of them with the steps
    # after the first already reported (rank 0 reports every report_interval_s): the test
    # sees step 155 up to a report window late, then blocks the cluster and injects the Xid,
    # whose drain takes seconds more; 145 paced steps (>= 8.7 s) leave room for all that.
    spec = tiny_spec("shrink-fsdp", nodes=2, gpus_per_node=2, min_nodes=1, steps=300,
                     checkpoint_every=150, parallelism={"zero_stage": 3})  # fmt: skip
    run_id = client.submit_run(spec)["id"]
    first_commit = wait_for("a committed checkpoint", lambda: committed(client, run_id))[0]
    first_attempt = client.get_run(run_id)["attempts"][0]["id"]
    wait_for(
        "attempt 1 to report steps past the checkpoint",
        lambda: (
            max(losses_by_attempt(client, run_id).get(first_attempt, {0: 0})) >= first_commit + 5
        ),
    )
    healthy, bad = client.get_run(run_id)["nodes"]
    free = len(slurm("sinfo", "-h", "-N", "-t", "idle", "-o", "%N", conf=conf).split())
    blocker = slurm("sbatch", "--parsable", "--exclusive", f"-N{free}",
                    f"--job-name=runyard-{TEST_DATABASE}-blocker", "--output=/dev/null",
                    "--wrap", "sleep 600", conf=conf).strip()  # fmt: skip
    try:
        wait_for(
            "the blocker to fill the cluster",
            lambda: (
                slurm("squeue", "-h", "-j", blocker, "-o", "%T", conf=conf).strip() == "RUNNING"
            ),
        )
        agents.append(bad, XID_79.format(pid=2))
        wait_for(
            "the run to shrink to the healthy node",
            lambda: "run.shrunk" in [e["kind"] for e in client.run_events(run_id)],
            timeout_s=60,
            context=lambda: [e["message"] for e in client.run_events(run_id)][-8:],
        )
        shrunk = client.get_run(run_id)
        assert shrunk["layout"]["dp"] == 2 and shrunk["layout"]["zero_stage"] == 3
        second = wait_for(
            "attempt 2 to train",
            lambda: [a for a in client.get_run(run_id)["attempts"][1:] if a["state"] == "RUNNING"],
            timeout_s=120,
        )[0]
        assert second["nodes"] == [healthy]
        wait_for(
            "attempt 2 to retrain the steps attempt 1 lost",
            lambda: len(losses_by_attempt(client, run_id).get(second["id"], {})) >= 3,
            timeout_s=120,
        )
    finally:
        slurm("scancel", blocker, conf=conf)
    by_attempt = losses_by_attempt(client, run_id)
    before, after = by_attempt[first_attempt], by_attempt[second["id"]]
    assert min(after) == second["resume_step"] + 1
    overlap = sorted(set(before) & set(after))
    assert overlap, ("attempt 1 must have reported steps past attempt 2's resume point",
                     sorted(before)[-3:], sorted(after)[:3])  # fmt: skip
    for step in overlap:  # fsdp over 4 ranks and over 2: the same losses
        assert after[step] == pytest.approx(before[step], abs=1e-4), step
    client.cancel_run(run_id)
    wait_for("the run to be cancelled", lambda: client.get_run(run_id)["state"] == "CANCELLED")
    client.resume_node(bad)
