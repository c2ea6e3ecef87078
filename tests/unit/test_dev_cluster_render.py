"""The dev cluster's Slurm configuration, rendered from slurm_templates/."""

from __future__ import annotations

from pathlib import Path

import pytest

from client.devcluster.render import ClusterShape, hostlist, render


def test_hostlist_and_leaves() -> None:
    assert hostlist(1, 1) == "gpu001"
    assert hostlist(3, 12) == "gpu[003-012]"
    shape = ClusterShape(num_nodes=10, leaf_size=4)
    assert [leaf.nodes for leaf in shape.leaves] == ["gpu[001-004]", "gpu[005-008]", "gpu[009-010]"]
    assert shape.port_of("gpu010") == 17010


def test_rendered_files_describe_the_cluster(tmp_path: Path) -> None:
    files = render(ClusterShape(num_nodes=8, leaf_size=4), tmp_path)
    slurm = files["slurm.conf"]
    assert "TopologyPlugin=topology/tree" in slurm
    assert (
        "NodeName=gpu[001-008] NodeHostname=localhost NodeAddr=127.0.0.1 Port=17001-17008" in slurm
    )
    assert "Gres=gpu:8" in slurm
    assert f"SlurmdSpoolDir={tmp_path}/slurmd/%n" in slurm
    assert "PartitionName=train" in slurm
    assert "SwitchName=spine Switches=leaf1,leaf2" in files["topology.conf"]
    assert f"File={tmp_path}/dev/nvidia[0-7]" in files["gres.conf"]


@pytest.mark.parametrize(("nodes", "leaf"), [(0, 1), (4, 5), (1281, 4)])
def test_bad_shapes_are_refused(nodes: int, leaf: int) -> None:
    with pytest.raises(ValueError, match="--"):
        ClusterShape(num_nodes=nodes, leaf_size=leaf)


def test_placement_packs_into_the_fewest_switches() -> None:
    from service.slurm.node_choice import choose_nodes, choose_replacement, placement_cost

    free = [
        ("gpu001", "leaf1"),
        ("gpu002", "leaf1"),
        ("gpu005", "leaf2"),
        ("gpu006", "leaf2"),
        ("gpu007", "leaf2"),
    ]
    assert choose_nodes(free, 2) == ["gpu001", "gpu002"]  # best fit: the smaller hole
    assert choose_nodes(free, 3) == ["gpu005", "gpu006", "gpu007"]
    assert choose_nodes(free, 4) == ["gpu005", "gpu006", "gpu007", "gpu001"]
    assert choose_nodes(free, 6) is None
    assert choose_replacement([("gpu008", "leaf2"), ("gpu003", "leaf1")], {"leaf1"}) == "gpu003"
    switch_of = {"a": "leaf1", "b": "leaf1", "c": "leaf2", "d": "leaf2"}
    # pp=4 over 4 nodes of 8 ranks with tp=8: three stage hops, one of them across switches.
    cost = placement_cost(["a", "b", "c", "d"], switch_of, ranks_per_node=8, tp=8, cp=1, pp=4)
    assert cost == {"num_nodes": 4, "switches_spanned": 2, "cross_switch_pipeline_edges": 1}


def test_accounting_adds_slurmdbd_and_points_slurm_at_it(tmp_path: Path) -> None:
    files = render(ClusterShape(num_nodes=8, leaf_size=4), tmp_path, accounting=True)
    assert "AccountingStorageType=accounting_storage/slurmdbd" in files["slurm.conf"]
    assert "AccountingStoragePort=16819" in files["slurm.conf"]
    assert "DbdPort=16819" in files["slurmdbd.conf"]
    assert "StoragePort=16306" in files["slurmdbd.conf"]
    without = render(ClusterShape(num_nodes=8, leaf_size=4), tmp_path)
    assert "AccountingStorageType=accounting_storage/none" in without["slurm.conf"]
    assert "slurmdbd.conf" not in without


def test_the_dev_service_reconciles_whatever_the_callers_environment_says(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The test suite turns the reconciler off in its own process and restarts the dev
    cluster's service from there: a service started with that setting would accept runs
    and never place them."""
    from client.devcluster.cluster import DevCluster

    monkeypatch.setenv("RUNYARD_RUN_RECONCILER", "false")
    env = DevCluster(tmp_path).service_env()
    assert env["RUNYARD_RUN_RECONCILER"] == "true"
    assert env["RUNYARD_DATABASE_URL"] == DevCluster(tmp_path).database_url
