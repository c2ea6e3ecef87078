"""How many nodes `runyard dev up --nodes N` lets one machine hold (client/devcluster)."""

from __future__ import annotations

import pytest

from client.devcluster.cluster import ALWAYS_ALLOWED_NODES, node_limit
from client.devcluster.render import MAX_NODES, ClusterShape


def test_the_agents_cpu_bounds_the_dev_box_and_memory_a_small_one() -> None:
    assert node_limit(21_800, 2) == 333  # 2 cores: half of them at 0.3% per agent
    assert node_limit(8_000, 16) == 110  # 16 cores, 8 GiB: (8,000 - 4,096) / 35.3 MiB
    # What always started before the check still does, however small the machine.
    assert node_limit(1_000, 1) == ALWAYS_ALLOWED_NODES


def test_the_shape_takes_up_to_the_products_largest_cluster() -> None:
    assert ClusterShape(num_nodes=MAX_NODES, leaf_size=16).leaves[-1].name == "leaf80"
    assert ClusterShape(num_nodes=1280, leaf_size=16).node_names[-1] == "gpu1280"
    with pytest.raises(ValueError, match="between 1 and 1280"):
        ClusterShape(num_nodes=MAX_NODES + 1)
