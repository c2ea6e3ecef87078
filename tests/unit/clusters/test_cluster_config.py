"""The clusters setting: the TOML file's format, its errors (each naming the field), the
default of one local cluster, and how each cluster's commands reach its controller."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from service.clusters import registry
from service.config import Settings
from service.config_areas.clusters import (
    ClusterReach,
    ClustersFileError,
    TopologySource,
    parse_clusters,
    read_clusters_file,
)
from service.slurm import cluster_info
from service.slurm.submit import AttemptRequest, SubmitSettings, sbatch_parameters
from service.slurm.target import SlurmTarget

SITE = {"partition": "train", "hardware": "h100-sxm", "network": "ib", "accelerator": "gpu"}
TWO_CLUSTERS = """
[[cluster]]
name = "runyard-dev"
reach = "local"

[[cluster]]
name = "runyard-dev-b"
hardware = "h200"
partition = "big"
spare_pool_target = 2
topology = "flat"
"""


def test_a_file_lists_clusters_the_default_first_and_fills_the_rest_from_the_site(
    tmp_path: Path,
) -> None:
    path = tmp_path / "clusters.toml"
    path.write_text(TWO_CLUSTERS)
    first, second = read_clusters_file(path, SITE)
    assert (first.name, first.reach, first.hardware) == (
        "runyard-dev",
        ClusterReach.LOCAL,
        "h100-sxm",
    )
    assert second.reach is ClusterReach.MULTICLUSTER  # Slurm's own way: -M through slurmdbd
    assert (second.hardware, second.partition, second.network) == ("h200", "big", "ib")
    assert second.spare_pool_target == 2 and second.topology is TopologySource.FLAT


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ({}, "cluster: no [[cluster]] table"),
        ({"clusters": []}, "clusters: unknown table"),
        ({"cluster": [{"name": "a", "reach": "ssh"}]}, "cluster[0].reach: Input should be"),
        ({"cluster": [{"name": "A b"}]}, "cluster[0].name: String should match pattern"),
        ({"cluster": [{"name": "a", "colour": "blue"}]}, "cluster[0].colour: Extra inputs"),
        ({"cluster": [{"name": "a", "reach": "slurm_conf"}]}, "needs slurm_conf"),
        ({"cluster": [{"name": "a"}, {"name": "a"}]}, "cluster.name: a is listed twice"),
        (
            {"cluster": [{"name": "a"}, {"spare_pool_target": -1}]},
            "cluster[1].name: Field required",
        ),
    ],
)
def test_bad_input_names_the_field(doc: dict[str, Any], words: str) -> None:
    with pytest.raises(ClustersFileError, match=re.escape(words)):
        parse_clusters(doc, SITE)


def test_an_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ClustersFileError, match=r"RUNYARD_CLUSTERS_FILE .*missing\.toml"):
        read_clusters_file(tmp_path / "missing.toml", SITE)
    broken = tmp_path / "broken.toml"
    broken.write_text("[[cluster]\nname=")
    with pytest.raises(ClustersFileError, match="not TOML"):
        read_clusters_file(broken, SITE)


def test_unset_means_one_local_cluster_with_the_sites_settings() -> None:
    settings = Settings(cluster_name="site-a", partition="gpu", hardware="a100")
    [only] = registry.clusters(settings)
    assert (only.name, only.reach, only.partition, only.hardware) == (
        "site-a",
        ClusterReach.LOCAL,
        "gpu",
        "a100",
    )
    assert registry.default_cluster(settings) is only
    with pytest.raises(registry.UnknownCluster, match=r"unknown cluster 'b'.*drives site-a"):
        registry.find_cluster(settings, "b")


def test_the_local_name_is_read_from_slurm_conf_else_the_controller_else_default(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "slurm.conf"
    conf.write_text("# comment\nSlurmctldHost=head\nClusterName=Runyard-Dev  # ours\n")
    assert cluster_info.local_cluster_name(conf) == "runyard-dev"  # Slurm lower-cases it

    def controller(*_: Any, **__: Any) -> subprocess.CompletedProcess[str]:
        out = "ClusterName             = from-ctld\nSLURM_VERSION           = 23.11.4\n"
        return subprocess.CompletedProcess([], 0, out, "")

    monkeypatch.setattr(subprocess, "run", controller)
    assert cluster_info.local_cluster_name(tmp_path / "none.conf") == "from-ctld"

    def down(*_: Any, **__: Any) -> subprocess.CompletedProcess[str]:
        return subprocess.CompletedProcess([], 1, "", "Unable to contact slurm controller")

    monkeypatch.setattr(subprocess, "run", down)
    assert cluster_info.local_cluster_name(tmp_path / "none.conf") == "default"


def test_each_cluster_is_reached_its_own_way(tmp_path: Path) -> None:
    site = Path("/etc/slurm/slurm.conf")
    own = tmp_path / "b.conf"
    configs = parse_clusters(
        {
            "cluster": [
                {"name": "a", "reach": "local"},
                {"name": "b", "reach": "multicluster"},
                {"name": "c", "reach": "slurm_conf", "slurm_conf": str(own)},
            ]
        },
        SITE,
    )
    a, b, c = (SlurmTarget.of(config, site) for config in configs)
    assert a.argv(["squeue", "-h"]) == ["squeue", "-h"]
    assert a.env({})["SLURM_CONF"] == str(site)
    assert b.argv(["squeue", "-h"]) == ["squeue", "-M", "b", "-h"]
    assert b.env({})["SLURM_CONF"] == str(site)  # the site's slurmdbd knows b's controller
    assert b.answer("CLUSTER: b\n12|RUNNING\n") == "12|RUNNING\n"
    assert c.argv(["squeue"]) == ["squeue"] and c.env({})["SLURM_CONF"] == str(own)
    assert (a.sbatch_clusters, b.sbatch_clusters, c.sbatch_clusters) == (None, "b", None)


def test_sbatch_asks_for_the_cluster_it_goes_to(tmp_path: Path) -> None:
    req = AttemptRequest(
        run_id=1,
        attempt_id=2,
        job_name="j",
        job_folder=tmp_path,
        num_nodes=1,
        ranks_per_node=1,
        time_limit_min=10,
    )
    here = SubmitSettings("train", "http://x", None)
    there = SubmitSettings("big", "http://x", None, clusters="runyard-dev-b")
    assert "clusters" not in sbatch_parameters(req, here)["additional_parameters"]
    params = sbatch_parameters(req, there)
    assert params["additional_parameters"]["clusters"] == "runyard-dev-b"
    assert params["partition"] == "big"
