"""`runyard dev up|down|status|render`: the local development cluster."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from client.dev_state import MAX_CLUSTERS, REPO_ROOT
from client.output import Exit, console, fail, hint, print_json, print_table

if TYPE_CHECKING:
    from client.devcluster.cluster import DevCluster

# The dev cluster's machinery (Postgres drivers, Slurm rendering, TLS) is imported by the
# command that uses it: every `runyard` call imports this module to list its commands, and
# those imports were more than half of a call's start (0.8 s of 1.45 s on 2 cores).

app = typer.Typer(
    help="The local development cluster (real Slurm on this machine).", no_args_is_help=True
)


def _say(message: str) -> None:
    console.print(f"[dim]..[/dim] {message}", highlight=False)


SLURM_PREFIX_OPTION = typer.Option(
    None,
    "--slurm",
    envvar="RUNYARD_DEV_SLURM",
    help="Run on the Slurm built into this prefix (scripts/build_slurm.sh, e.g. "
    "/opt/slurm-24.11) instead of Debian's: its own state folder (.runyard/dev-<name>), "
    "ports 1000 above and database, so it runs beside the default cluster or alone.",
)


def _cluster(
    slurm: Path | None, *, port: int | None = None, replicas: int = 1, num_clusters: int = 1
) -> DevCluster:
    """The dev cluster on Debian's Slurm, or on the one built into `slurm`; its service
    drives `num_clusters` clusters."""
    from client.devcluster import cluster

    if slurm is None:
        return cluster.DevCluster(
            cluster.default_state_dir(),
            service_port=port or 8000,
            replicas=replicas,
            num_clusters=num_clusters,
        )
    prefix = slurm.resolve()
    return cluster.DevCluster(
        cluster.default_state_dir(prefix),
        service_port=port or 8000 + cluster.PREFIX_PORT_OFFSET,
        replicas=replicas,
        slurm_prefix=prefix,
        database_url=cluster.prefix_database_url(prefix),
        num_clusters=num_clusters,
    )


@app.command()
def up(
    nodes: int = typer.Option(8, help="Number of slurmd nodes (gpu001...)."),
    leaf_size: int | None = typer.Option(
        None, help="Nodes per leaf switch or block (4; 2 on topology/block)."
    ),
    port: int | None = typer.Option(
        None, help="Service port on 127.0.0.1 (8000; 9000 with --slurm)."
    ),
    replicas: int = typer.Option(
        1, min=1, max=8, help="Service processes; more than one sit behind a proxy on --port."
    ),
    slurm: Path | None = SLURM_PREFIX_OPTION,
    clusters: int = typer.Option(
        1,
        min=1,
        max=MAX_CLUSTERS,
        help="Slurm clusters: a second (runyard-dev-b: its own slurmctld and slurmds, "
        "ports 2000 above, state in .runyard/dev-b) registers with the first's slurmdbd, "
        "so `sbatch -M`, `squeue -M all` and `sacct -M` reach both; the service drives "
        "both (its clusters file, .runyard/dev/clusters.toml) and agents watch both's nodes. "
        "A service already up keeps its clusters: `runyard dev down` first.",
    ),
    with_: list[str] = typer.Option(
        [],
        "--with",
        help="mlflow: also an MLflow tracking server on Postgres (127.0.0.1:5000), and the "
        "service pointed at it (`dev down` first if the service is up).",
    ),
) -> None:
    """Start munged, slurmctld, one slurmd per node, Postgres, the service and the agents."""
    from client.devcluster import cluster, multicluster
    from client.devcluster.postgres import PostgresUnavailable

    dev = _cluster(slurm, port=port, replicas=replicas, num_clusters=clusters)
    unknown = [extra for extra in with_ if extra != "mlflow"]
    if unknown:
        fail(f"--with: unknown {', '.join(unknown)}; the only one is mlflow", Exit.USAGE)
    try:
        if "mlflow" in with_:
            from client.devcluster.mlflow import MlflowUnavailable, ensure_dev_server

            try:
                _say(f"mlflow: {ensure_dev_server(dev.database_url, dev.state_dir).url}")
            except MlflowUnavailable as exc:
                fail(str(exc), Exit.ERROR)
        cluster.up(nodes, leaf_size, dev, say=_say)
        members = multicluster.up_members(dev, clusters, say=_say)
    except (cluster.DevClusterError, PostgresUnavailable, ValueError) as exc:
        fail(str(exc), Exit.ERROR)
    # One line each: at 80 columns one line wrapped after "slurm:", which then read empty.
    console.print(f"service: {dev.service_url}", highlight=False, soft_wrap=True)
    console.print(f"slurm:   SLURM_CONF={dev.slurm_conf}", highlight=False, soft_wrap=True)
    for member in members:
        console.print(
            f"slurm:   {member.cluster_name}: SLURM_CONF={member.slurm_conf}",
            highlight=False,
            soft_wrap=True,
        )
    hint(f"source {dev.state_dir / 'env.sh'}  (sets SLURM_CONF and RUNYARD_URL for sinfo/squeue)")
    if members:
        console.print(f"clusters file: {dev.clusters_file}", highlight=False, soft_wrap=True)
        names = ",".join(m.cluster_name for m in [dev, *members])
        hint(f"squeue -M {names}  (or sbatch -M {members[0].cluster_name}: any cluster from here)")


@app.command()
def render(
    out: Path = typer.Option(..., "--out", help="Folder for slurm.conf, topology.conf, gres.conf."),
    nodes: int = typer.Option(8, help="Number of slurmd nodes (gpu001...)."),
    leaf_size: int = typer.Option(4, help="Nodes per leaf switch."),
    containers: bool = typer.Option(
        False, "--containers", help="One host per node (docker-compose), not one box."
    ),
    state_dir: Path = typer.Option(
        Path("/var/lib/runyard/slurm"), help="Slurm's state, spool and log folder (containers)."
    ),
) -> None:
    """Write the Slurm configuration from slurm_templates/ (docker-compose's nodes use this)."""
    from client.devcluster import render as render_mod
    from client.devcluster.render import ClusterShape

    try:
        shape = ClusterShape(num_nodes=nodes, leaf_size=leaf_size)
    except ValueError as exc:
        fail(str(exc), Exit.USAGE)
    network = render_mod.containers() if containers else None
    files = render_mod.render(shape, state_dir, network=network)
    out.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (out / name).write_text(text)
    console.print(f"wrote {', '.join(sorted(files))} to {out}")


@app.command()
def down(slurm: Path | None = SLURM_PREFIX_OPTION) -> None:
    """Stop exactly the processes `dev up` started (every cluster of --clusters)."""
    from client.devcluster import cluster
    from client.devcluster.mlflow import stop_dev_server

    dev = _cluster(slurm)
    stopped = cluster.down(dev, say=_say)

    if stop_dev_server(dev.state_dir):
        stopped = [*stopped, "mlflow"]
    console.print(f"stopped {len(stopped)} processes" if stopped else "nothing was running")


@app.command()
def status(
    json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
    slurm: Path | None = SLURM_PREFIX_OPTION,
) -> None:
    """What `dev up` started and whether it still runs."""
    from client.devcluster import cluster

    table = cluster.status(_cluster(slurm))
    if json:
        return print_json(table)
    if not table:
        console.print("the dev cluster is not up")
        raise typer.Exit(Exit.ERROR)
    print_table(
        None,
        ["PROCESS", "PID", "RUNNING", "LOG"],
        [(n, p["pid"], "yes" if p["running"] else "NO", p["log"]) for n, p in table.items()],
    )
    if not all(p["running"] for p in table.values()):
        raise typer.Exit(Exit.ERROR)


@app.command()
def demo(
    no_failure: bool = typer.Option(False, "--no-failure", help="Do not inject a failure."),
    fast: bool = typer.Option(
        True,
        "--fast/--no-fast",
        help="Then the same failure on the fast path: two replica groups of a tp 2 layout.",
    ),
    timeout_s: float = typer.Option(600, help="Give up after this long."),
    data: bool = typer.Option(
        False,
        "--data",
        help="Your own data instead: a corpus and a BPE tokenizer, `runyard data prepare`, "
        "a run from a Hugging Face checkpoint, `runyard run export`, transformers generates.",
    ),
) -> None:
    """Train on 2 nodes with a spare held; an Xid 79 hits one node mid-run; watch it recover,
    then watch two replica groups recover from the same failure without stopping."""
    if data:
        # The own-data path is a script of the commands a user types (examples/).
        script = REPO_ROOT / "examples" / "own_data_demo.py"
        raise typer.Exit(subprocess.run([sys.executable, str(script)]).returncode)
    from client.api import ApiError, RunyardClient
    from client.devcluster import cluster
    from client.devcluster.demo import (
        DemoFailed,
        print_goodput,
        return_drained_nodes,
        run_demo,
        run_fast_demo,
        summarize,
        summarize_fast,
    )

    dev = cluster.DevCluster(cluster.default_state_dir())
    client = RunyardClient(dev.service_url)
    try:
        run = run_demo(
            client, console, dev.kern_log, inject_failure=not no_failure, timeout_s=timeout_s
        )
        summarize(client, console, run)
        return_drained_nodes(client, console)
        if fast and not no_failure and run["state"] == "SUCCEEDED":
            fast_run = run_fast_demo(client, console, dev.kern_log, timeout_s=timeout_s)
            summarize_fast(client, console, run, fast_run)
            return_drained_nodes(client, console)
            run = fast_run
        else:
            print_goodput({"classic": client.get_run(run["id"])})
    except ApiError as exc:
        fail(exc.message, Exit.UNREACHABLE if exc.status is None else Exit.ERROR)
    except DemoFailed as exc:
        fail(str(exc))
    if run["state"] != "SUCCEEDED":
        fail(f"run {run['id']} ended {run['state']}: {run['state_reason']}")
