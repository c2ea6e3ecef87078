"""Pinned parallel layouts through the real service and Slurm, and a layout change across a
resume: a run that loses a node with no spare left shrinks, and its FSDP checkpoint from 4
ranks reshards onto the 2 that remain, retracing the same losses.

The numerics of every layout against a single-process reference are checked under torchrun
in tests/unit/worker/test_worker_layouts.py; here the point is the whole path: the spec's
`parallelism`, resolve, the planner's admission, sbatch, the ranks' meshes, checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from client.api import RunyardClient
from tests.conftest import TEST_DATABASE, wait_for
from tests.integration.conftest import Agents, ServiceProcess, ended, slurm, tiny_spec

pytestmark = pytest.mark.integration

XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, name=python, GPU has fallen off the bus."


def committed(client: RunyardClient, run_id: int) -> list[int]:
    return [c["step"] for c in client.run_checkpoints(run_id) if c["state"] == "COMMITTED"]


def losses_by_attempt(client: RunyardClient, run_id: int) -> dict[int, dict[int, float]]:
    found: dict[int, dict[int, float]] = {}
    for row in client.run_metrics(run_id, after_step=-1, limit=10_000):
        found.setdefault(row["attempt_id"], {})[row["step"]] = row["loss"]
    return found


@dataclass(frozen=True)
class Pinned:
    cluster: dict[str, int]
    parallelism: dict[str, Any]
    layout: dict[str, int]  # what the service must resolve it to
    # Each rank's place in the mesh, as the worker prints it (worker/parallel/parallel_dims.py,
    # ParallelDims.describe_coordinates): ranks run dp outermost, then pp, cp, and tp
    # innermost, so tensor-parallel peers are adjacent ranks on one node.
    ranks: tuple[str, ...]


PINNED = {
    # Tensor (and sequence) parallel between the 2 ranks of one node.
    "tp2": Pinned({"nodes": 1, "gpus_per_node": 2}, {"dp": 1, "tp": 2}, {"tp": 2, "dp": 1},
                  ("dp 0/1 tp 0/2 pp 0/1 cp 0/1", "dp 0/1 tp 1/2 pp 0/1 cp 0/1")),
    # Two pipeline stages on two nodes, 1F1B over 2 micro batches.
    "pp2": Pinned({"nodes": 2, "gpus_per_node": 1}, {"pp": 2}, {"pp": 2, "dp": 1},
                  ("dp 0/1 tp 0/1 pp 0/2 cp 0/1", "dp 0/1 tp 0/1 pp 1/2 cp 0/1")),
    # FSDP (ZeRO-3) over 2 nodes x 2 ranks.
    "fsdp4": Pinned({"nodes": 2, "gpus_per_node": 2}, {"zero_stage": 3},
                    {"dp": 4, "zero_stage": 3},
                    tuple(f"dp {r}/4 tp 0/1 pp 0/1 cp 0/1" for r in range(4))),
    # Context parallel over 2 ranks, data parallel over the 2 nodes.
    "cp2xdp2": Pinned({"nodes": 2, "gpus_per_node": 2}, {"cp": 2}, {"cp": 2, "dp": 2},
                      ("dp 0/2 tp 0/1 pp 0/1 cp 0/2", "dp 0/2 tp 0/1 pp 0/1 cp 1/2",
                       "dp 1/2 tp 0/1 pp 0/1 cp 0/2", "dp 1/2 tp 0/1 pp 0/1 cp 1/2")),
}  # fmt: skip


@dataclass(frozen=True)
class LayoutRun:
    submitted: dict[str, Any]  # the service's answer to the submission
    final: dict[str, Any]  # the run once it ended


@pytest.fixture(scope="module")
def layout_runs(service: ServiceProcess) -> dict[str, LayoutRun]:
    """The four pinned layouts (7 of the 8 nodes), submitted together and waited for
    together: each is short, and most of a run's time is its start, which they share."""
    client = service.client()
    submitted = {
        name: client.submit_run(
            tiny_spec(
                f"layout-{name}",
                model="tiny",  # two blocks: pp2 puts one on each stage
                steps=24,
                checkpoint_every=8,
                parallelism=pinned.parallelism,
                **pinned.cluster,
            )
        )
        for name, pinned in PINNED.items()
    }

    def all_ended() -> dict[str, dict[str, Any]] | None:
        runs = {name: ended(client, run["id"]) for name, run in submitted.items()}
        return {name: run for name, run in runs.items() if run} if all(runs.values()) else None

    finals = wait_for(
        "the four layout runs to end",
        all_ended,
        timeout_s=480,
        context=lambda: {
            name: [e["message"] for e in client.run_events(run["id"])][-4:]
            for name, run in submitted.items()
        },
    )
    return {name: LayoutRun(submitted[name], finals[name]) for name in PINNED}


def mesh_lines(client: RunyardClient, run_id: int, rank: int) -> list[str]:
    log = client.run_logs(run_id, attempt=1, rank=rank)["text"]
    return [line for line in log.splitlines() if line.startswith("mesh: ")]


@pytest.mark.parametrize("name", list(PINNED))
def test_a_pinned_layout_trains_to_the_end_on_the_mesh_it_asked_for(
    service: ServiceProcess, layout_runs: dict[str, LayoutRun], name: str
) -> None:
    client, pinned = service.client(), PINNED[name]
    run, final = layout_runs[name].submitted, layout_runs[name].final
    for field, value in pinned.layout.items():
        assert run["layout"][field] == value, (field, run["layout"])
    # Every rank built its share of the layout: a worker that trained plain data parallel
    # whatever the layout would print dp r/W on every rank.
    world = len(pinned.ranks)
    for rank, where in enumerate(pinned.ranks):
        assert mesh_lines(client, run["id"], rank) == [f"mesh: rank {rank} of {world}: {where}"]
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
    client.cancel_run(run_id, now=True)
    wait_for("the run to be cancelled", lambda: client.get_run(run_id)["state"] == "CANCELLED")
    client.resume_node(bad)
