"""`runyard node ...`: the cluster's nodes, and what on-call does to them."""

from __future__ import annotations

import typer

from client.commands.common import call
from client.output import console, hint, print_json, print_table, short_time

app = typer.Typer(help="Compute nodes.", no_args_is_help=True)
JSON = typer.Option(False, "--json", help="Print JSON for scripts.")


CLUSTER = typer.Option(None, "--cluster", help="Only this cluster's (`runyard cluster list`).")


@app.command("list")
def list_(cluster: str | None = CLUSTER, json: bool = JSON) -> None:
    """Every node: runyard's state, Slurm's state, switch and last heartbeat."""
    nodes = call(lambda c: c.list_nodes(cluster))
    if json:
        return print_json(nodes)
    # A node is (cluster, name): its cluster is shown where more than one is listed.
    several = len({n.get("cluster") for n in nodes}) > 1
    print_table(
        None,
        ["NODE", "STATE", "SLURM", "SWITCH", "GPUS", "HEARTBEAT", "REASON"],
        [
            (
                f"{n['cluster']}/{n['name']}" if several else n["name"],
                n["state"] + (" SLOW" if n.get("slow_since") else ""),
                n["slurm_state"],
                n["switch"],
                n["num_gpus"],
                short_time(n["last_heartbeat_at"]),
                n["slurm_reason"] or n["state_reason"],
            )
            for n in nodes
        ],
    )


@app.command()
def show(name: str, json: bool = JSON) -> None:
    """One node with its history: state changes, Xids, heartbeats lost."""
    node = call(lambda c: c.get_node(name))
    if json:
        return print_json(node)
    console.print(
        f"[bold]{node['name']}[/bold] {node['state']} ({node['state_reason']}); "
        f"Slurm {node['slurm_state']} {node['slurm_reason']}; switch {node['switch']}; "
        f"application errors {node['num_app_errors']}"
    )
    if node.get("slow_since"):
        console.print(
            f"[bold yellow]SLOW[/bold yellow] since {short_time(node['slow_since'])}: its "
            f"ranks' update time {node['slow_ratio']:.2f}x its peers' median "
            f"({node['num_slow_reports']} consecutive reports)"
        )
    elif node.get("num_slow_reports"):
        console.print(
            f"slower than its peers in the last {node['num_slow_reports']} report(s) "
            f"({node['slow_ratio']:.2f}x): not flagged yet"
        )
    print_table(
        "history",
        ["TIME", "KIND", "CODE", "ACTION", "MESSAGE"],
        [
            (short_time(e["created_at"]), e["kind"], e["code"], e["action"], e["message"][:90])
            for e in node["events"]
        ],
    )


@app.command()
def drain(
    name: str, reason: str = typer.Option(..., help="Shown in `sinfo -R`."), json: bool = JSON
) -> None:
    """Drain a node; a run on it moves to a spare."""
    incident = call(lambda c: c.drain_node(name, reason))
    if json:
        return print_json(incident)
    console.print(
        f"{name}: drain requested"
        + (f" (incident {incident['id']})" if incident else " (one is already in progress)")
    )
    hint(f"runyard node show {name}")


@app.command()
def resume(
    name: str,
    force: bool = typer.Option(False, help="Also if someone else drained it."),
    cluster: str | None = typer.Option(
        None, "--cluster", help="Its cluster (default: the service's default cluster)."
    ),
    json: bool = JSON,
) -> None:
    """Return a drained node to service (only runyard's own drains unless --force)."""
    node = call(lambda c: c.resume_node(name, force, cluster))
    if json:
        return print_json(node)
    console.print(f"{name}: {node['state']}")
    hint("runyard node list")
