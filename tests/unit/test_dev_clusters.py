"""`runyard dev up --clusters 2` (issue 41): the second cluster's names, ports and configs,
and `dev down` stopping it before the first. Rendering is pure; the processes stopped here
are real ones this test starts, in folders of its own (the dev cluster is never touched)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest
from typer.testing import CliRunner

from client.cli import app
from client.devcluster import cluster
from client.devcluster.cluster import DevCluster, configs_of, env_script
from client.devcluster.clusters_file import clusters_toml
from client.devcluster.processes import Started, is_alive, spawn
from client.devcluster.render import PARTITION, ClusterShape, render
from service.config_areas.clusters import ClusterReach, parse_clusters

SHAPE = ClusterShape(num_nodes=8, leaf_size=4)


def first_cluster(state_dir: Path, slurm_prefix: Path | None = None) -> DevCluster:
    return DevCluster(state_dir, database_url="postgresql://unused", slurm_prefix=slurm_prefix)


def test_the_second_cluster_is_named_and_placed_beside_the_first(tmp_path: Path) -> None:
    first = first_cluster(tmp_path / "dev")
    second = first.member_cluster(2)
    assert (first.cluster_name, second.cluster_name) == ("runyard-dev", "runyard-dev-b")
    assert second.state_dir == tmp_path / "dev-b"
    assert second.slurm_conf == tmp_path / "dev-b" / "slurm.conf"
    assert (first.port_offset, second.port_offset) == (0, 2000)
    assert first.dbd_port == second.dbd_port == 16819  # one slurmdbd: the first's
    assert first.member_cluster(1) is first


def test_a_prefix_clusters_second_sits_clear_of_every_other(tmp_path: Path) -> None:
    """The prefix cluster is 1000 above the packaged one, its second 3000: no two of the
    four share a port offset, and the prefix pair meets in the prefix's own slurmdbd."""
    prefix = Path("/opt/slurm-24.11")
    second = first_cluster(tmp_path / "dev-slurm-24.11", prefix).member_cluster(2)
    assert second.port_offset == 3000
    assert second.dbd_port == 17819
    assert second.state_dir.name == "dev-slurm-24.11-b"


def test_only_two_clusters_and_only_the_first_has_members(tmp_path: Path) -> None:
    first = first_cluster(tmp_path / "dev")
    with pytest.raises(ValueError, match="--clusters"):
        first.member_cluster(3)
    with pytest.raises(ValueError, match="not the first"):
        first.member_cluster(2).member_cluster(2)


def test_the_second_clusters_slurm_conf_points_at_the_firsts_slurmdbd(tmp_path: Path) -> None:
    second = first_cluster(tmp_path / "dev").member_cluster(2)
    files = configs_of(second, SHAPE, with_accounting=True)
    slurm = files["slurm.conf"]
    assert "ClusterName=runyard-dev-b\n" in slurm
    assert "SlurmctldPort=18817\n" in slurm
    # The same node names as the first's, on ports of its own.
    assert "NodeName=gpu[001-008] NodeHostname=localhost NodeAddr=127.0.0.1 Port=19001-19008" in (
        slurm
    )
    assert "AccountingStorageType=accounting_storage/slurmdbd" in slurm
    assert "AccountingStorageHost=127.0.0.1\n" in slurm
    assert "AccountingStoragePort=16819\n" in slurm
    assert f"StateSaveLocation={second.state_dir}/slurmctld" in slurm
    assert "slurmdbd.conf" not in files  # it runs none of its own


def test_the_first_cluster_renders_as_it_did_alone(tmp_path: Path) -> None:
    """The default `dev up` is unchanged: the first's configs are render()'s defaults."""
    first = first_cluster(tmp_path / "dev")
    files = configs_of(first, SHAPE, with_accounting=True)
    assert files == render(SHAPE, first.state_dir, accounting=True)
    assert "ClusterName=runyard-dev\n" in files["slurm.conf"]
    assert "DbdPort=16819" in files["slurmdbd.conf"]


def test_render_with_a_shared_slurmdbd_renders_none_of_its_own(tmp_path: Path) -> None:
    files = render(SHAPE, tmp_path, accounting=True, port_offset=2000, shared_dbd_port=17819)
    assert "AccountingStoragePort=17819\n" in files["slurm.conf"]
    assert "slurmdbd.conf" not in files


def test_the_second_clusters_env_sh_names_its_slurm_conf_only(tmp_path: Path) -> None:
    first = first_cluster(tmp_path / "dev")
    second = first.member_cluster(2)
    assert env_script(second) == f"export SLURM_CONF={second.slurm_conf}\n"
    assert f"export RUNYARD_URL={first.service_url}\n" in env_script(first)


def test_dev_down_stops_the_second_cluster_before_the_first(tmp_path: Path) -> None:
    """The second's slurmctld reports to the first's slurmdbd: it goes first. Stand-ins
    (real processes, recorded as `up` records them) play both daemons."""
    first = first_cluster(tmp_path / "dev")
    second = first.member_cluster(2)
    standins = []
    for one, name in ((first, "slurmdbd"), (second, "slurmctld")):
        one.state_dir.mkdir(parents=True)
        standins.append(spawn(name, ["sleep", "600"], one.state_dir / "log" / f"{name}.out"))
        one.table.save({name: standins[-1]})
    assert set(cluster.status(first)) == {"slurmdbd", "runyard-dev-b/slurmctld"}
    said: list[str] = []
    stopped = cluster.down(first, say=said.append)
    assert stopped == ["runyard-dev-b/slurmctld", "slurmdbd"]
    assert said == ["stopped runyard-dev-b/slurmctld", "stopped slurmdbd"]
    assert not any(is_alive(p) for p in standins)
    assert first.table.load() == second.table.load() == {}


def test_a_third_cluster_is_refused_before_anything_starts() -> None:
    result = CliRunner().invoke(app, ["dev", "up", "--clusters", "3"])
    assert result.exit_code == 2
    assert "--clusters" in result.output


def test_the_services_clusters_file_names_both_clusters_as_the_service_reads_it(
    tmp_path: Path,
) -> None:
    first = DevCluster(tmp_path / "dev", database_url="postgresql://unused", num_clusters=2)
    names = [first.member_cluster(m).cluster_name for m in first.member_numbers]
    configs = parse_clusters(tomllib.loads(clusters_toml(names)), {})
    local, remote = configs
    assert (local.name, local.reach) == ("runyard-dev", ClusterReach.LOCAL)
    assert (remote.name, remote.reach) == ("runyard-dev-b", ClusterReach.MULTICLUSTER)
    assert local.partition == remote.partition == PARTITION
    assert remote.spare_pool_target == 1 and remote.accelerator == "cpu"
    assert first.service_env()["RUNYARD_CLUSTERS_FILE"] == str(tmp_path / "dev" / "clusters.toml")


def test_plain_dev_up_gives_the_service_no_clusters_file(tmp_path: Path) -> None:
    assert "RUNYARD_CLUSTERS_FILE" not in first_cluster(tmp_path / "dev").service_env()


def test_the_second_clusters_agents_say_their_cluster_and_read_its_kernel_logs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    started: dict[str, list[str]] = {}

    def record(name: str, argv: list[str], log: Path, env: dict[str, str]) -> Started:
        started[f"{log.parent.parent.name}/{name}"] = argv
        return Started(name=name, pid=1, executable=argv[0], log=str(log))

    monkeypatch.setattr(cluster, "spawn", record)
    first = DevCluster(tmp_path / "dev", database_url="postgresql://unused", num_clusters=2)
    second = first.member_cluster(2)
    for on in (first, second):
        on.agent_token_file("gpu001").parent.mkdir(parents=True)
        on.agent_token_file("gpu001").write_text("token\n")
        cluster.start_agents(first, on, ["gpu001"], {})
    here, there = started["dev/agent:gpu001"], started["dev-b/agent:gpu001"]
    assert "--cluster" not in here  # the first cluster's agents run as they always have
    assert there[there.index("--cluster") + 1] == "runyard-dev-b"
    assert there[there.index("--kernel-log") + 1] == str(second.kern_log("gpu001"))
    assert str(tmp_path / "dev-b" / "nodes" / "gpu001") in there
    assert there[there.index("--service-url") + 1] == first.service_url
