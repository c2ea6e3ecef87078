"""Slow nodes and silent data corruption on the worker (issue 15).

Pure parts first (the fault hooks, the per-node figure, the replica vote), then one launch
of three gloo ranks on three named "nodes" (health_driver.py) trains two scenarios:
- slow_step:3:1: from step 3 on, rank 1 sleeps 0.3 s inside its timed update; every
  report after that names node1's update time at least 0.3 s, the others' under 0.2 s, while
  the lock-step wall time of a step is the same on every rank;
- flip_param:5:2 with sdc_check_every 4 (layout dp 3, zero_stage 0: three equal
  replicas): the comparison at step 4 passes, the one at step 8 finds rank 2 outvoted;
  rank 0 reports node2 with clean step 4, every rank raises, and nothing was saved at 8.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from worker_helpers import clean_env, tiny_spec

from worker import faults
from worker.checkpoint import latest_committed
from worker.sdc import odd_ones, param_checksum
from worker.stragglers import node_update_s

REPO_ROOT = Path(__file__).resolve().parents[3]


def rows(metrics: Path, kind: str) -> list[dict[str, Any]]:
    lines = [json.loads(line) for line in metrics.read_text().splitlines()]
    return [row for row in lines if row["kind"] == kind]


def test_slow_step_fires_from_its_step_on_and_flip_param_at_its_step_only() -> None:
    points = faults.fault_points_from_env(
        "tiny",
        1,
        environ={"RUNYARD_FAULT": "slow_step:3:1,flip_param:5:2", "RUNYARD_FAULT_SLOW_S": "0.001"},
    )
    assert isinstance(points, faults.InjectedFaults)
    assert [points.slow_down_s(s, 1) for s in (2, 3, 9)] == [None, 0.001, 0.001]
    assert points.slow_down_s(9, 0) is None
    weights = torch.nn.Parameter(torch.ones(4))
    before = param_checksum([weights]).item()
    points.after_update(4, 2, [weights])
    points.after_update(5, 1, [weights])
    assert param_checksum([weights]).item() == before  # not its step, not its rank
    points.after_update(5, 2, [weights])
    assert param_checksum([weights]).item() != before
    assert weights[0].item() == pytest.approx(1.0, rel=1e-3)  # silent: the value barely moves


def test_a_node_is_as_slow_as_its_slowest_rank() -> None:
    assert node_update_s([0.1, 0.3, 0.1, 0.1], ["a", "a", "b", "b"]) == {"a": 0.3, "b": 0.1}


def test_the_majority_names_the_odd_replica_and_two_replicas_name_both() -> None:
    assert odd_ones([7, 7, 7], [0, 0, 0]) == ([], False)
    assert odd_ones([7, 9, 7], [0, 0, 0]) == ([1], False)
    # Two replica sets (key = the non-dp coordinates): only the set that differs speaks.
    assert odd_ones([7, 5, 7, 5, 8, 5], [0, 1, 0, 1, 0, 1]) == ([4], False)
    assert odd_ones([7, 9], [0, 0]) == ([0, 1], True)  # no majority: both named


@pytest.mark.heavy  # three ranks as processes: 11 s, make test-all
@pytest.mark.timeout(300)
def test_three_ranks_see_the_slow_rank_and_the_flipped_replica(
    tmp_path: Path, data_cache_dir: Path
) -> None:
    layout = {"dp": 3, "zero_stage": 0, "micro_batch_size": 4}
    common = {"layout": layout, "global_batch": 12, "report_interval_s": 0.01}
    slow = tiny_spec(tmp_path / "slow", data_cache_dir, steps=8, **common)
    flip = tiny_spec(
        tmp_path / "flip", data_cache_dir, steps=10, sdc_check_every=4, checkpoint_every=4,
        keep_checkpoints=5, **common,
    )  # fmt: skip
    scenarios = [
        {"name": "slow", "fault": "slow_step:3:1", "metrics": str(tmp_path / "slow.jsonl"),
         "config": slow},
        {"name": "flip", "fault": "flip_param:5:2", "metrics": str(tmp_path / "flip.jsonl"),
         "config": flip},
    ]  # fmt: skip
    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"scenarios": scenarios}))
    driver = Path(__file__).with_name("health_driver.py")
    launch = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=3",
         str(driver), str(plan)],
        env=clean_env(PYTHONPATH=str(REPO_ROOT)), capture_output=True, text=True, timeout=280,
    )  # fmt: skip
    assert launch.returncode == 0, launch.stdout[-5000:] + launch.stderr[-5000:]

    times = {r["step"]: r["update_s"] for r in rows(tmp_path / "slow.jsonl", "node_update_s")}
    assert set(times[1]) == {"node0", "node1", "node2"}
    for step in range(4, 9):  # every window from step 4 on holds only slowed steps
        figures = times[step]
        # The sleep (0.3 s) is all in node1's figure; two cores shared by three ranks
        # jitter the others' by tens of ms.
        assert figures["node1"] >= 0.3 > 0.2 > max(figures["node0"], figures["node2"]), figures
    # Before the fault nobody sleeps (step 1's update is slow everywhere: AdamW creates
    # its state on the first step).
    assert max(times[2].values()) < 0.2, times[2]

    sdc_rows = rows(tmp_path / "flip.jsonl", "sdc")
    assert [(r["step"], r["nodes"], r["clean_step"]) for r in sdc_rows] == [(8, ["node2"], 4)]
    assert [r["step"] for r in rows(tmp_path / "flip.jsonl", "sdc_clean")] == [4]
    assert "rank 2 on node2 (outvoted)" in sdc_rows[0]["message"]
    raised = sorted(p.name for p in tmp_path.glob("flip.jsonl.sdc.*"))
    assert raised == ["flip.jsonl.sdc.0", "flip.jsonl.sdc.1", "flip.jsonl.sdc.2"]
    resume = latest_committed(tmp_path / "flip")
    assert resume is not None and resume.step == 4  # nothing saved at the failed comparison
