"""topology/block's pure parts: the blocks a dev cluster describes, the segment a layout
asks for, and placement that keeps each model replica inside one block."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from client.devcluster.render import ClusterShape, render
from planner.blocks import block_plan, replica_nodes
from service.slurm.node_choice import choose_nodes


def test_a_block_cluster_describes_its_leaves_as_blocks_with_aligned_sizes(tmp_path: Path) -> None:
    files = render(ClusterShape(num_nodes=8, leaf_size=2), tmp_path, topology="block")
    assert "TopologyPlugin=topology/block" in files["slurm.conf"]
    lines = [line for line in files["topology.conf"].splitlines() if not line.startswith("#")]
    assert lines == [
        "BlockName=block1 Nodes=gpu[001-002]",
        "BlockName=block2 Nodes=gpu[003-004]",
        "BlockName=block3 Nodes=gpu[005-006]",
        "BlockName=block4 Nodes=gpu[007-008]",
        "BlockSizes=2,4,8",
    ]
    tree = render(ClusterShape(num_nodes=8, leaf_size=2), tmp_path)
    assert "TopologyPlugin=topology/tree" in tree["slurm.conf"]
    assert "SwitchName=spine Switches=leaf1,leaf2,leaf3,leaf4" in tree["topology.conf"]
    with pytest.raises(ValueError, match="multiple of --leaf-size"):
        render(ClusterShape(num_nodes=7, leaf_size=2), tmp_path, topology="block")


def test_a_second_cluster_moves_its_accounting_ports(tmp_path: Path) -> None:
    files = render(ClusterShape(), tmp_path, accounting=True, port_offset=1000)
    assert "AccountingStoragePort=17819" in files["slurm.conf"]
    assert "DbdPort=17819" in files["slurmdbd.conf"]
    assert "StoragePort=17306" in files["slurmdbd.conf"]


def test_a_replica_spans_the_nodes_of_its_tp_cp_pp_ranks() -> None:
    assert replica_nodes(tp=8, cp=1, pp=4, gpus_per_node=8) == 4
    assert replica_nodes(tp=2, cp=1, pp=1, gpus_per_node=8) == 1  # four replicas a node
    assert replica_nodes(tp=4, cp=1, pp=3, gpus_per_node=8) == 3  # 12 ranks: 2 per 3 nodes
    # An NVL72 rack: 18 nodes of 4 GPUs; tp 4 x pp 9 fills half a rack.
    nvl72 = block_plan(36, tp=4, cp=1, pp=9, gpus_per_node=4, block_size=18)
    assert (nvl72.segment, nvl72.min_blocks) == (9, 2)
    too_big = block_plan(8, tp=8, cp=1, pp=4, gpus_per_node=8, block_size=2)
    assert too_big.segment is None and "cross blocks" in too_big.describe()


def test_placement_on_blocks_takes_whole_replicas_from_each_block() -> None:
    # Blocks of 4 with 3, 3 and 2 free nodes; replicas of 2 nodes.
    free = [
        ("gpu001", "block1"),
        ("gpu002", "block1"),
        ("gpu003", "block1"),
        ("gpu005", "block2"),
        ("gpu006", "block2"),
        ("gpu007", "block2"),
        ("gpu009", "block3"),
        ("gpu010", "block3"),
    ]
    chosen = choose_nodes(free, 6, group_nodes=2)
    assert chosen is not None
    # Two nodes from each block: no replica (consecutive pair) straddles two blocks.
    block_of = dict(free)
    pairs = [chosen[i : i + 2] for i in range(0, 6, 2)]
    assert all(block_of[a] == block_of[b] for a, b in pairs), pairs
    # Whole replicas only: 2 + 2 + 2 usable nodes, so 8 cannot be placed.
    assert choose_nodes(free, 8, group_nodes=2) is None
    # The same nodes one at a time (a tree's leaves): 3 + 3 from the two largest.
    assert choose_nodes(free, 6) == ["gpu001", "gpu002", "gpu003", "gpu005", "gpu006", "gpu007"]


def test_a_blocked_node_is_idle_but_not_free() -> None:
    """BLOCKED (Slurm 24.05+): an idle node another job's --exclusive=topo block holds;
    placing a run there would leave it pending."""
    from service.slurm.commands import SlurmNode
    from service.slurm.snapshot import ClusterSnapshot

    nodes = {
        "gpu001": SlurmNode("gpu001", "IDLE+BLOCKED", "", "127.0.0.1", 8),
        "gpu002": SlurmNode("gpu002", "IDLE", "", "127.0.0.1", 8),
    }
    snapshot = ClusterSnapshot(nodes, {}, "default")
    assert snapshot.free_nodes() == {"gpu002"}
    assert not snapshot.is_free("gpu001") and snapshot.is_usable("gpu001")


def test_on_blocks_an_attempt_asks_for_segments_through_its_reservation(
    tmp_path: Path,
) -> None:
    """Slurm 24.11 refuses --segment beside a node list, and a node list alone must sit in
    one aligned block (both seen on the 24.11 dev cluster): the attempt names its
    reservation, which holds exactly its nodes, and asks --segment instead."""
    from submitit.slurm.slurm import _make_sbatch_string

    from service.config import get_settings
    from service.slurm.submit import AttemptRequest, SubmitSettings, sbatch_parameters

    req = AttemptRequest(
        run_id=1,
        attempt_id=2,
        job_name="runyard-x-r1-a2",
        job_folder=tmp_path,
        num_nodes=4,
        ranks_per_node=1,
        time_limit_min=30,
        nodelist="gpu003,gpu004,gpu005,gpu006",
        reservation="runyard-x-run1",
        segment=2,
    )
    settings = SubmitSettings.of(get_settings())
    script = _make_sbatch_string(
        command="true", folder=tmp_path, **sbatch_parameters(req, settings)
    )
    assert "#SBATCH --segment=2" in script and "#SBATCH --reservation=runyard-x-run1" in script
    assert "--nodelist" not in script
    tree = _make_sbatch_string(
        command="true", folder=tmp_path, **sbatch_parameters(replace(req, segment=None), settings)
    )
    assert "#SBATCH --nodelist=gpu003,gpu004,gpu005,gpu006" in tree and "--segment" not in tree


def test_run_show_names_the_blocks_a_run_spans_and_its_segment() -> None:
    from client.commands import run

    placement = {
        "topology": "block",
        "groups": {"block2": "gpu[003-004]", "block3": "gpu[005-006]"},
        "block_size": 2,
        "segment": 2,
    }
    assert run.topology_text(placement) == (
        "blocks block2 gpu[003-004], block3 gpu[005-006] (2 of 2 nodes; --segment=2)"
    )
    tree = {"topology": "tree", "groups": {"leaf1": "gpu[001-002]"}}
    assert run.topology_text(tree) == "leaf switches leaf1 gpu[001-002]"
    assert run.topology_text({"nodes": ["gpu001"]}) == ""  # placed before this was recorded
    # A helper, not a command: `run show` is still the command that prints it.
    commands = {c.callback.__name__ for c in run.app.registered_commands if c.callback}
    assert "show" in commands and "topology_text" not in commands
