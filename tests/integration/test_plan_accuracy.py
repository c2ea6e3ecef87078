"""The planner checked against what the dev cluster measures, and a vocabulary tensor
parallel does not divide, through the real service and Slurm.

A run is planned, trains, and `runyard plan accuracy` shows its predicted and measured step
time (the dev cluster trains on CPUs, so the two differ by orders of magnitude and the run
is marked as not comparable: it never calibrates the planner). A model with GPT-2's
vocabulary (50,257, which tp 2 does not divide) trains at tp 2 to the losses it has at tp 1,
and its Hugging Face export has the tokenizer's 50,257 rows, not the padded 51,200.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from safetensors.torch import load_file
from typer.testing import CliRunner

from client.api import RunyardClient
from client.cli import app
from tests.conftest import wait_for
from tests.integration.conftest import ONE_BLOCK_MODEL, ServiceProcess, tiny_spec

pytestmark = pytest.mark.integration
runner = CliRunner()
GPT2_VOCAB = 50_257
LOSS_ATOL = 1e-3


def cli(service: ServiceProcess, *args: str) -> tuple[int, str]:
    env = {"RUNYARD_URL": service.url, "RUNYARD_TOKEN": service.admin_token}
    result = runner.invoke(app, list(args), env=env)
    return result.exit_code, result.output


def succeeded(client: RunyardClient, run_id: int) -> dict[str, Any]:
    wait_for(
        f"run {run_id} to end",
        lambda: client.get_run(run_id)["state"] in ("SUCCEEDED", "FAILED"),
        timeout_s=300,
        context=lambda: [e["message"] for e in client.run_events(run_id)][-8:],
    )
    run = client.get_run(run_id)
    assert run["state"] == "SUCCEEDED", run["state_reason"]
    return run


def test_plan_accuracy_shows_a_trained_runs_predicted_and_measured_step_time(
    service: ServiceProcess,
) -> None:
    client = service.client()
    run = client.submit_run(tiny_spec("accuracy", steps=30, checkpoint_every=10))
    planned = run["plan"]["step_time_s"]
    succeeded(client, run["id"])
    code, out = cli(service, "plan", "accuracy", "--json")
    assert code == 0, out
    (row,) = [r for r in json.loads(out)["runs"] if r["run_id"] == run["id"]]
    assert row["predicted_step_s"] == pytest.approx(planned)
    # Every step of the tests' runs is paced to at least 60 ms (conftest's pace_step).
    assert row["measured_step_s"] >= 0.9 * 0.06 and row["num_measured_steps"] >= 20
    assert row["step_error"] == pytest.approx(planned / row["measured_step_s"] - 1)
    assert row["accelerator"] == "cpu" and not row["comparable"]
    assert row["measured_checkpoint_s"] is not None and row["num_measured_steps"] <= 30
    code, out = cli(service, "plan", "accuracy")
    assert code == 0, out
    cells = " ".join(out.replace("│", " ").split())  # the table's cells, one space apart
    assert (
        f"{row['run_id']} (cpu) {row['model_size']} {row['layout_family']} 2 "
        f"{row['predicted_step_s']:.3g} {row['measured_step_s']:.3g} {row['step_error']:+.1%}"
    ) in cells


def losses(client: RunyardClient, run_id: int) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in client.run_metrics(run_id, after_step=-1, limit=10_000)}


def test_a_gpt2_vocabulary_trains_at_tp2_as_at_tp1_and_exports_unpadded(
    service: ServiceProcess, tmp_path: Path
) -> None:
    client = service.client()
    model = ONE_BLOCK_MODEL | {"vocab": GPT2_VOCAB}
    common = {"model": model, "nodes": 1, "steps": 20, "checkpoint_every": 20}
    tp2 = client.submit_run(
        tiny_spec("vocab-tp2", gpus_per_node=2, parallelism={"tp": 2, "dp": 1}, **common)
    )
    tp1 = client.submit_run(
        tiny_spec("vocab-tp1", gpus_per_node=1, parallelism={"tp": 1, "dp": 1}, **common)
    )
    assert tp2["layout"]["tp"] == 2 and tp1["layout"]["tp"] == 1
    succeeded(client, tp2["id"])
    succeeded(client, tp1["id"])
    at_tp2, at_tp1 = losses(client, tp2["id"]), losses(client, tp1["id"])
    assert sorted(at_tp2) == sorted(at_tp1) == list(range(1, 21))
    worst = max(abs(at_tp2[s] - at_tp1[s]) for s in at_tp1)
    assert worst < LOSS_ATOL, worst
    assert at_tp2[20] < at_tp2[1] - 0.5  # it learned, from about ln(50,257) = 10.8

    out_dir = tmp_path / "exported"
    code, out = cli(service, "run", "export", str(tp2["id"]), "--out", str(out_dir), "--json")
    assert code == 0, out
    assert json.loads((out_dir / "config.json").read_text())["vocab_size"] == GPT2_VOCAB
    tensors = load_file(out_dir / "model.safetensors")
    for name in ("model.embed_tokens.weight", "lm_head.weight"):
        assert tuple(tensors[name].shape) == (GPT2_VOCAB, model["hidden"]), name
