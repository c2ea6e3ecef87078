"""The `runyard` command: one sub-command group per noun."""

from __future__ import annotations

import typer

from client.commands import (
    admin,
    cluster,
    data,
    dev,
    doctor,
    incident,
    login,
    node,
    notify,
    plan,
    run,
    spare,
    sweep,
    token,
    tracking,
)

app = typer.Typer(
    help="runyard: training-run orchestration for Slurm clusters.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
app.add_typer(run.app, name="run")
app.add_typer(sweep.app, name="sweep")
app.add_typer(cluster.app, name="cluster")
app.add_typer(node.app, name="node")
app.add_typer(spare.app, name="spare")
app.add_typer(incident.app, name="incident")
app.add_typer(admin.app, name="admin")
app.add_typer(dev.app, name="dev")
app.add_typer(data.app, name="data")
app.add_typer(notify.app, name="notify")
app.add_typer(tracking.app, name="tracking")
app.add_typer(plan.app, name="plan")
app.add_typer(token.app, name="token")
app.command(name="doctor")(doctor.doctor)
app.command(name="login")(login.login)
app.command(name="logout")(login.logout)


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def agent(ctx: typer.Context) -> None:
    """Run the node health agent (see `runyard agent --help`)."""
    from worker.agent.main import main as agent_main

    agent_main(ctx.args)


def main() -> None:
    app()
