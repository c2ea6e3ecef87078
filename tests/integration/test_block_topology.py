"""topology/block on a real Slurm 24.11 (`make test-slurm-24.11`: the dev cluster on the
Slurm scripts/build_slurm.sh builds, its eight nodes in four blocks of two). A run of two
blocks' worth of nodes, pipeline stages split over each block's two nodes, lands on whole
blocks and is asked with --segment; an Xid on one of its nodes moves that node's replica
whole into a block with room. Skipped on a cluster without topology/block (22.05)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from client.api import RunyardClient
from planner.presets import MODEL_PRESETS
from service.slurm.commands import parse_key_values
from service.slurm.hostlist import expand_hostlist
from service.slurm.topology import Topology, TopologyKind, parse_topology
from tests.conftest import wait_for
from tests.integration.conftest import Agents, committed, slurm, tiny_spec

pytestmark = pytest.mark.integration

XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid={pid}, name=python, GPU has fallen off the bus."


@pytest.fixture
def blocks(slurm_cluster) -> Topology:
    topology = parse_topology(
        slurm("scontrol", "show", "topology", conf=str(slurm_cluster.slurm_conf))
    )
    if topology.kind is not TopologyKind.BLOCK or not topology.block_size:
        pytest.skip("needs the topology/block dev cluster (make test-slurm-24.11)")
    return topology


def replicas_inside_blocks(nodes: list[str], topology: Topology, size: int) -> bool:
    pairs = [nodes[i : i + size] for i in range(0, len(nodes), size)]
    return all(len({topology.group_of[n] for n in pair}) == 1 for pair in pairs)


def test_a_run_of_two_blocks_lands_on_whole_blocks_and_its_replacement_in_a_block_with_room(
    spare_pool: RunyardClient, agents: Agents, slurm_cluster, blocks: Topology
) -> None:
    client, conf, size = spare_pool, str(slurm_cluster.slurm_conf), blocks.block_size
    assert size is not None
    spec = tiny_spec(
        "two-blocks",
        model=MODEL_PRESETS["tiny"].model_dump(),  # two layers: one per pipeline stage
        nodes=2 * size,
        parallelism={"pp": size, "tp": 1, "cp": 1},  # a replica fills one block
        steps=400,
    )
    run_id = client.submit_run(spec)["id"]
    wait_for("a committed checkpoint", lambda: committed(client, run_id), timeout_s=120)
    run = client.get_run(run_id)
    placed = run["nodes"]
    spanned = {blocks.group_of[n] for n in placed}
    members = {b: {n for n, g in blocks.group_of.items() if g == b} for b in spanned}
    assert len(spanned) == 2 and set(placed) == set().union(*members.values()), placed
    assert run["placement"]["segment"] == size and run["placement"]["topology"] == "block"
    # Slurm 24.11 prints no segment in `scontrol show job`; the batch script says what was
    # asked, and the job ran where runyard placed it: blocks 2 and 3 are no aligned block,
    # which Slurm takes only with --segment.
    job = run["attempts"][0]["slurm_job_id"]
    shown = parse_key_values(" ".join(slurm("scontrol", "show", "job", job, conf=conf).split()))
    script = Path(shown["Command"]).read_text()
    assert f"#SBATCH --segment={size}" in script and "--nodelist" not in script
    assert set(expand_hostlist(shown["NodeList"])) == set(placed)

    bad = placed[1]
    agents.append(bad, XID_79.format(pid=os.getpid()))
    second = wait_for(
        "attempt 2 running",
        lambda: next(
            (a for a in client.get_run(run_id)["attempts"][1:] if a["state"] == "RUNNING"), None
        ),
        timeout_s=120,
    )
    moved = second["nodes"]
    assert bad not in moved and len(moved) == 2 * size
    assert replicas_inside_blocks(moved, blocks, size), moved
    # The failed node's replica left its block whole, for one that had room.
    landed = {blocks.group_of[n] for n in moved} - spanned
    assert len(landed) == 1 and blocks.group_of[bad] not in {blocks.group_of[n] for n in moved}
    kinds = [e["kind"] for e in client.run_events(run_id)]
    assert "recovery.replica_moves" in kinds
    resume = second["resume_step"]
    wait_for(
        "attempt 2 training past its resume step",
        lambda: (client.get_run(run_id)["last_step"] or 0) > resume + 3,
        timeout_s=120,
    )
    client.cancel_run(run_id, now=True)
    wait_for("the run cancelled", lambda: client.get_run(run_id)["state"] == "CANCELLED")
