"""`runyard doctor`: on the head node, check Slurm, Postgres, the shared filesystem, the
agents, who the service runs as, and its TLS and MUNGE; print what is wrong and how to fix
it. Exit 0 healthy, 1 problems found."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import typer

from client.doctor.result import Area, Check, SiteSettings, Status
from client.output import Exit, console, fail, print_json, print_table

STYLE = {Status.OK: "green", Status.WARN: "yellow", Status.FAIL: "red", Status.SKIP: "dim"}


def run_checks(settings: SiteSettings, areas: set[Area]) -> list[Check]:
    """The checks of `areas`, in the order a site fixes them (Slurm first)."""
    # The checks' modules (Postgres drivers, Slurm's and TLS's helpers) load here, not at
    # the top: every `runyard` call imports this module to list its commands.
    from client.doctor.hooks import check_hooks
    from client.doctor.identity import check_identity
    from client.doctor.site import check_agents, check_clusters, check_filesystem, check_postgres
    from client.doctor.slurm import check_slurm
    from client.doctor.wire import check_wire

    checks: list[Check] = []
    slurm_up = True
    if Area.SLURM in areas:
        checks += check_slurm(settings)
        slurm_up = checks[0].status is not Status.FAIL
        checks += check_hooks(settings, slurm_up)  # what slurmd runs as root
        checks += check_clusters(settings)  # each further cluster, as the service reaches it
    if Area.POSTGRES in areas:
        checks += check_postgres(settings)
    if Area.FILESYSTEM in areas:
        checks += check_filesystem(settings, slurm_up)
    if Area.AGENTS in areas:
        checks += check_agents(settings)
    if Area.IDENTITY in areas:
        checks += check_identity(settings)
    if Area.WIRE in areas:
        checks += check_wire(settings)
    return checks


def doctor(
    settings_file: Path | None = typer.Option(
        None,
        "--settings",
        help="The RUNYARD_* settings file the service's unit loads "
        "(default /etc/runyard/runyard.env when it exists); the environment overrides it.",
    ),
    only: list[Area] = typer.Option(
        [], "--only", help="Check only these areas (repeat the option); default all."
    ),
    checkpoint_root: Path | None = typer.Option(
        None, help="The checkpoint folder to check (default: the settings')."
    ),
    min_free_gb: float = typer.Option(20.0, help="Warn below this much free checkpoint space."),
    heartbeat_max_age_s: float = typer.Option(
        20.0, help="A node whose agent was silent longer is a problem."
    ),
    probe_nodes: int = typer.Option(2, help="Nodes that write a file to the shared folder."),
    json: bool = typer.Option(False, "--json", help="Print JSON for scripts."),
) -> None:
    """Is this site ready for runyard? Checks Slurm, Postgres, the shared filesystem, agents."""
    try:
        settings = SiteSettings.load(settings_file)
    except OSError as exc:
        fail(f"--settings: cannot read {settings_file}: {exc.strerror}", Exit.USAGE)
    settings = dataclasses.replace(
        settings,
        checkpoint_root=checkpoint_root or settings.checkpoint_root,
        min_free_gb=min_free_gb,
        heartbeat_max_age_s=heartbeat_max_age_s,
        probe_nodes=probe_nodes,
    )
    checks = run_checks(settings, set(only) or set(Area))
    problems = [c for c in checks if c.status is Status.FAIL]
    if json:
        print_json(
            {
                "healthy": not problems,
                "checks": [{**dataclasses.asdict(c), "status": c.status.value} for c in checks],
            }
        )
    else:
        print_table(
            None,
            ["AREA", "CHECK", "STATUS", "DETAIL"],
            [
                (c.area.value, c.name, f"[{STYLE[c.status]}]{c.status.value}[/]", c.detail)
                for c in checks
            ],
        )
        for c in checks:
            if c.fix:
                console.print(f"[bold]fix {c.area.value} {c.name}:[/bold] {c.fix}", highlight=False)
        if problems:
            console.print(
                f"[red]{len(problems)} problem(s):[/red] "
                + "; ".join(f"{c.area.value} {c.name}" for c in problems)
            )
        else:
            console.print("[green]healthy:[/green] runyard can run on this site")
    if problems:
        raise typer.Exit(Exit.ERROR)
