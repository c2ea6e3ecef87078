"""A NaN at step 13 on the real cluster (issue 15): the worker reports it, the service rolls
the run back to step 10 with the data of steps 11-15 skipped, and the run finishes without
a restart counted. Its losses after the skip are those of a run that never saw that window:
the same config trained here in one process with the skip from the start (the data order is
a function of the step and does not depend on dp, so one rank reproduces the run's two)."""

from __future__ import annotations

import json
import os
from datetime import datetime
from pathlib import Path

import pytest

from contract import WorkerRunConfig
from tests.conftest import wait_for
from tests.integration.conftest import Agents, ServiceProcess, ended, inject_faults, tiny_spec

pytestmark = [pytest.mark.integration, pytest.mark.whole_path]

NAN_RUN = "nan-rollback"
FAULTS = (f"nan_at_step:13:*:1@{NAN_RUN}",)  # attempt 1 only
inject_faults(*FAULTS)


def reference_losses(run: dict, tmp_path: Path, skips: list[dict]) -> dict[int, float]:
    """The run's config on one rank, fresh, with `skips` from the start."""
    from worker.launch import read_launch_env
    from worker.reporter import FileReporter
    from worker.train import train

    spec = run["spec"]
    config = WorkerRunConfig.model_validate(
        {
            "run_id": 0,
            "attempt_id": 0,
            "attempt_number": 1,
            "name": "reference",
            "model": run["model_shape"],
            "layout": {"dp": 1, "micro_batch_size": spec["global_batch"]},
            "seq_len": spec["seq_len"],
            "global_batch": spec["global_batch"],
            "steps": spec["steps"],
            "lr": spec.get("lr", 3e-4),
            "seed": spec.get("seed", 1234),
            "checkpoint_every": spec["checkpoint_every"],
            "checkpoint_dir": str(tmp_path / "ckpt"),
            "data_cache_dir": str(tmp_path / "data"),
            "data_skips": skips,
        }
    )
    metrics = tmp_path / "metrics.jsonl"
    saved = os.environ.pop("RUNYARD_FAULT", None)
    try:
        train(config, read_launch_env({}), FileReporter(metrics))
    finally:
        if saved is not None:
            os.environ["RUNYARD_FAULT"] = saved
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    return {r["step"]: r["loss"] for r in rows if r["kind"] == "metric"}


@pytest.mark.timeout(240)
def test_a_nan_rolls_back_skips_the_window_and_finishes(
    service: ServiceProcess, agents: Agents, tmp_path: Path
) -> None:
    client = service.client()
    spec = tiny_spec(NAN_RUN, steps=30, checkpoint_every=10, keep_checkpoints=3, max_restarts=0)
    run_id = client.submit_run(spec)["id"]
    run = wait_for("the run to end", lambda: ended(client, run_id), timeout_s=200)

    attempts = run["attempts"]
    assert run["state"] == "SUCCEEDED", (run["state_reason"], attempts)
    assert [a["stop_reason"] for a in attempts] == ["rolled_back", "completed"]
    assert [a["resume_step"] for a in attempts] == [None, 10]
    assert run["num_restarts"] == 0  # max_restarts 0: a rollback costs none
    [rollback] = run["rollbacks"]
    assert rollback["anomaly_step"] == 13 and rollback["resume_step"] == 10
    assert (rollback["skip_from_step"], rollback["skip_steps"]) == (11, 5)
    assert "non-finite loss (nan) at step 13" in rollback["message"]
    kinds = [e["kind"] for e in client.run_events(run_id)]
    assert "run.rolled_back" in kinds
    # Attempt 1's steps after the step-10 commit were thrown away with their data, never
    # trained again: their time is rolled back, none of it recomputed, and it is a part of
    # attempt 1's training time.
    lost = run["goodput"]["lost"]
    first = attempts[0]
    trained_s = (
        datetime.fromisoformat(first["ended_at"]) - datetime.fromisoformat(first["first_step_at"])
    ).total_seconds()
    assert 0 < lost["rolled_back_s"] < trained_s, (lost, trained_s)
    assert lost["recomputed_steps_s"] == 0, lost

    # Attempt 2's losses are a run's that never saw steps 11-15's data.
    second = attempts[1]["id"]
    trained = {
        m["step"]: m["loss"] for m in client.run_metrics(run_id) if m["attempt_id"] == second
    }
    assert sorted(trained) == list(range(11, 31))
    expected = reference_losses(run, tmp_path, [{"from_step": 11, "steps": 5}])
    for step in range(11, 31):
        assert trained[step] == pytest.approx(expected[step], abs=5e-3), step
