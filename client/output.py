"""Tables for people, JSON for scripts, one-line errors with a non-zero exit."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NoReturn

import typer
from rich.console import Console
from rich.table import Table

console = Console()
err_console = Console(stderr=True)


class Exit:
    OK = 0
    ERROR = 1  # the service refused or failed
    USAGE = 2  # bad input on our side
    UNREACHABLE = 3  # the service could not be reached
    RUN_CANCELLED = 4  # `run watch`: the run was cancelled (FAILED exits with ERROR)
    STILL_RUNNING = 5  # `run watch --timeout-s`: gave up while the run still goes on


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data, indent=2, default=str))


def print_table(title: str | None, columns: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    table = Table(title=title, header_style="bold")
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*["" if v is None else str(v) for v in row])
    console.print(table)


def fail(message: str, code: int = Exit.ERROR) -> NoReturn:
    # soft_wrap: one line, whatever the terminal width, so scripts can grep it.
    err_console.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(code)


def hint(message: str) -> None:
    console.print(f"[dim]next: {message}[/dim]", highlight=False)


def short_time(value: str | None) -> str:
    return value.replace("T", " ")[:19] if value else ""
