"""Two real Slurm clusters on this machine, in Slurm's own multi-cluster operation (issue
41, `runyard dev up --clusters 2`): the dev cluster and a second one, runyard-dev-b, with a
slurmctld and slurmds of its own and the first's slurmdbd. From the first's SLURM_CONF,
`sbatch -M` places a job on either, `squeue -M all` and `sacct -M` read both back, and the
two have the same node names."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from client.devcluster import accounting, cluster
from client.devcluster.cluster import DevCluster
from client.devcluster.processes import is_alive
from tests.conftest import TEST_DATABASE, wait_for

pytestmark = pytest.mark.integration

# The session's jobs carry its name, so clean_up_test_leftovers cancels any left behind.
JOB_NAME = f"runyard-{TEST_DATABASE}-clusters"
USER, ACCOUNT = "alice", "vision"  # a dev user and her team's account (identity.py)


def slurm(*args: str, conf: Path, user: str | None = None) -> str:
    """A Slurm client command with `conf` as SLURM_CONF (as `user`: the job is theirs)."""
    done = subprocess.run(
        list(args),
        capture_output=True,
        text=True,
        env={**os.environ, "SLURM_CONF": str(conf)},
        user=user,
        cwd="/tmp",  # a folder the user may enter: the job's working folder
        timeout=30,
    )
    assert done.returncode == 0, f"{' '.join(args)}: {done.stderr}"
    return done.stdout


def by_cluster(rows: str) -> dict[str, list[list[str]]]:
    """`-O Cluster,...` output (fields split on |, the first the cluster), by cluster."""
    out: dict[str, list[list[str]]] = {}
    for row in rows.splitlines():
        name, *fields = (field.strip() for field in row.split("|"))
        if name:
            out.setdefault(name, []).append(fields)
    return out


@pytest.fixture(scope="module")
def first() -> DevCluster:
    """The dev cluster's Slurm and slurmdbd: started if they are not up, left as they are
    if they are. Its service and agents, if up, keep running: a second cluster needs only
    the first's slurmdbd, and no service of this test touches either cluster."""
    if not accounting.available():
        pytest.skip(
            "no Slurm accounting here (slurmdbd, mariadb-server; scripts/bootstrap.sh "
            "installs them): the clusters meet in one slurmdbd"
        )
    dev = DevCluster(cluster.default_state_dir())
    slurmctld = dev.table.load().get("slurmctld")
    if slurmctld is None or not is_alive(slurmctld) or not accounting.listening(dev.dbd_port):
        cluster.up(cluster=dev, with_service=False, say=lambda _: None)
    if not accounting.listening(dev.dbd_port):
        pytest.skip(f"the dev cluster in {dev.state_dir} runs without slurmdbd")
    return dev


def test_a_job_on_each_cluster_from_the_first_read_back_from_both(
    first: DevCluster, second_cluster: DevCluster
) -> None:
    """alice submits from the first cluster's SLURM_CONF to each cluster with `-M`; the
    jobs are read back with `squeue -M all` (slurmctld keeps finished jobs, MinJobAge) and
    with `sacct -M`, each under its own cluster, charged to her team's account there."""
    clusters = [first.cluster_name, second_cluster.cluster_name]
    for name in clusters:
        slurm(
            "sbatch", "-M", name, f"--job-name={JOB_NAME}", f"--account={ACCOUNT}", "-N1",
            "--output=/dev/null", "--wrap", "hostname", conf=first.slurm_conf, user=USER,
        )  # fmt: skip

    def finished_in_squeue() -> dict[str, list[list[str]]] | None:
        rows = slurm(
            "squeue", "-M", "all", "-t", "all", "-h", f"--name={JOB_NAME}",
            "-O", "Cluster:|,UserName:|,State:|,NodeList:", conf=first.slurm_conf,
        )  # fmt: skip
        jobs = by_cluster(rows)
        done = all(
            [fields[:2] for fields in jobs.get(n, [])] == [[USER, "COMPLETED"]] for n in clusters
        )
        return jobs if done else None

    jobs = wait_for("both jobs completed in `squeue -M all`", finished_in_squeue, timeout_s=60)
    assert set(jobs) >= set(clusters)

    def recorded_in_sacct() -> dict[str, list[list[str]]] | None:
        rows = slurm(
            "sacct", "-M", ",".join(clusters), "-X", "-n", "-P", f"--name={JOB_NAME}",
            "-o", "Cluster,User,Account,State", conf=first.slurm_conf,
        )  # fmt: skip
        jobs = by_cluster(rows)
        wanted = [[USER, ACCOUNT, "COMPLETED"]]
        return jobs if all(jobs.get(n) == wanted for n in clusters) else None

    wait_for("both jobs in `sacct -M` (slurmdbd)", recorded_in_sacct, timeout_s=60)


def test_the_second_cluster_reaches_the_first_too(
    first: DevCluster, second_cluster: DevCluster
) -> None:
    """Either cluster's SLURM_CONF reaches both: the slurmdbd lists every controller."""
    rows = slurm(
        "sinfo", "-M", first.cluster_name, "-h", "-O", "Cluster:|", conf=second_cluster.slurm_conf
    )
    assert set(by_cluster(rows)) == {first.cluster_name}


def test_node_names_repeat_across_the_clusters(
    first: DevCluster, second_cluster: DevCluster
) -> None:
    """Both clusters have gpu001...: Slurm keeps nodes per cluster; on this machine each
    cluster's slurmds are told apart by their ports and state folders."""
    rows = slurm(
        "sinfo", "-M", f"{first.cluster_name},{second_cluster.cluster_name}", "-h", "-N",
        "-O", "Cluster:|,NodeList:", conf=first.slurm_conf,
    )  # fmt: skip
    nodes = {name: {fields[0] for fields in rows_} for name, rows_ in by_cluster(rows).items()}
    shape = cluster.saved_shape(first)
    assert shape is not None
    assert nodes[first.cluster_name] == nodes[second_cluster.cluster_name] == set(shape.node_names)
