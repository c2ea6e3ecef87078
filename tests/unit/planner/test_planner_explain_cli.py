"""`runyard plan --explain`: where the chosen layout's step time goes, as a table or JSON."""

from __future__ import annotations

import json

import pytest
import typer
from typer.testing import CliRunner

from client.commands.plan import plan

app = typer.Typer()
app.command()(plan)


@app.callback()
def _group() -> None:
    """Mount `plan` as a sub-command, as client/cli.py does."""


LONG = ["plan", "--model", "llama3-8b", "--gpus", "64", "--seq", "131072"]
LONG += ["--global-batch-tokens", "2097152"]


def test_explain_table_puts_attention_first_at_128k() -> None:
    result = CliRunner().invoke(app, [*LONG, "--explain"])
    assert result.exit_code == 0, result.output
    table = result.output.split("where a ")[1]
    rows = [line for line in table.splitlines() if line.startswith("│ ") and "%" in line]
    assert rows[0].split("│")[1].strip() == "attention"
    assert "flash-attention-2" in table and "head dim 128" in table


def test_explain_json_adds_up_to_the_step_time() -> None:
    result = CliRunner().invoke(app, [*LONG, "--explain", "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.output)
    causes = body["step_explained"]
    assert {c["cause"] for c in causes} >= {"gemms", "attention", "cp_comm", "dp_comm"}
    assert sum(c["seconds"] for c in causes) == pytest.approx(body["step_time_s"])


def test_without_explain_the_json_is_unchanged() -> None:
    result = CliRunner().invoke(app, [*LONG, "--json"])
    assert "step_explained" not in json.loads(result.output)
