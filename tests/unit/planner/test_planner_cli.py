"""`runyard plan` as a user runs it: tables, --json, and one-line errors with exit codes."""

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


BASE = ["plan", "--gpus", "64", "--seq", "8192", "--global-batch-tokens", "4194304"]


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, [*BASE, *args])
    return result.exit_code, result.output


def test_json_is_one_object_with_the_plan() -> None:
    code, out = run("--model", "llama3-8b", "--json")
    assert code == 0, out
    body = json.loads(out)
    assert body["num_gpus"] == 64 and body["layout"]["dp"] * body["layout"]["tp"] > 0
    assert body["tokens_per_s"] > 0 and body["spare_nodes"] >= 0


def test_table_shows_best_runners_up_and_rejections() -> None:
    code, out = run("--model", "llama3-8b")
    assert code == 0, out
    for words in ("best", "runners-up", "rejected", "does_not_fit", "goodput"):
        assert words in out


def test_explicit_shape_plans_without_a_preset() -> None:
    code, out = run(
        "--layers",
        "96",
        "--hidden",
        "12288",
        "--heads",
        "96",
        "--ffn",
        "49152",
        "--vocab",
        "50257",
        "--mlp",
        "gelu",
        "--hardware",
        "a100-80gb",
        "--json",
    )
    assert code == 0, out
    assert json.loads(out)["num_params"] == pytest.approx(175e9, rel=0.01)


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["--model", "gpt-17"], 2, "unknown model 'gpt-17'"),
        (["--layers", "8"], 2, "missing --hidden"),
        (
            ["--model", "llama3-8b", "--tp", "16"],
            2,
            "error: tp (16) must divide the model's kv_heads (8)",
        ),
        (["--model", "llama3-8b", "--mlp", "relu"], 2, "--mlp must be swiglu or gelu"),
        (["--model", "llama3-405b", "--tp", "8", "--pp", "1", "--cp", "1"], 1, "does not fit"),
    ],
)
def test_bad_input_is_one_line_and_a_non_zero_exit(args: list[str], code: int, words: str) -> None:
    got, out = run(*args)
    assert got == code, out
    assert out.startswith("error:") and words in " ".join(out.split())


def test_the_checkpoint_interval_is_shown_for_each_recovery_path() -> None:
    # Two groups pinned: on 8 nodes the planner alone keeps one (its groups cost more
    # than the rare failures they save), and shows no fast path at all.
    pinned = ("--model", "llama3-8b", "--replica-groups", "2")
    code, out = run(*pinned, "--json")
    assert code == 0, out
    ckpt = json.loads(out)["checkpoint"]
    # 8 nodes fail once a month: Daly's classic interval is hours, and the fast path's is
    # never shorter (its cap only bounds how old the durable copy gets).
    assert ckpt["fast_interval_steps"] >= ckpt["interval_steps"] > 0
    code, out = run(*pinned)
    assert code == 0, out
    text = " ".join(out.split())  # rich wraps long lines
    assert f"checkpoint every {ckpt['interval_steps']} steps" in text
    assert f"checkpoint every {ckpt['fast_interval_steps']} steps" in text
