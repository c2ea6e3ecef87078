"""Replica groups get the plain loop's checks, written once: two groups of one rank each
(real torchft lighthouse, gloo), as test_worker_fault_tolerance.py starts them.

- Silent data corruption: a parameter bit flipped in group 1 is found by comparing each
  rank with the same mesh coordinate in the other group (the groups hold equal copies
  whatever the layout); with two groups neither is outvoted, so each group names its own
  node, reports it, and every group stops for the service's rollback.
- A non-finite loss is found by the group that computed it, which reports the anomaly and
  stops (the service then rolls every group back from disk).
- Slow-node timing: every group's rank 0 sends its nodes' update times.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from test_worker_fault_tolerance import PACE, start_group
from worker_helpers import tiny_spec

# Ranks as processes training together: make test-all (make test keeps the whole paths).
pytestmark = pytest.mark.heavy

STEPS = 12


def rows(path: Path, kind: str) -> list[dict[str, Any]]:
    lines = path.read_text().splitlines() if path.exists() else []
    return [r for r in map(json.loads, filter(None, lines)) if r["kind"] == kind]


def two_groups(tmp: Path, data_cache_dir: Path, fault: str) -> tuple[int, int]:
    """Train two groups of one rank, group 1 (attempt 2) under `fault`; their exit codes."""
    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(
        bind="[::]:0", min_replicas=1, join_timeout_ms=1000, heartbeat_timeout_ms=1000
    )
    try:
        procs = []
        for g in (0, 1):
            spec = tiny_spec(
                tmp / "ckpt",
                data_cache_dir,
                name="checks",
                attempt_number=1 + g,
                steps=STEPS,
                global_batch=8,
                checkpoint_every=100,
                sdc_check_every=2,
                layout={"dp": 2, "micro_batch_size": 4},
                fault_tolerance={"group": g, "groups": 2, "lighthouse_addr": lighthouse.address()},
            )
            procs.append(start_group(spec, tmp, f"g{g}", RUNYARD_FAULT=f"{PACE},{fault}"))
        return procs[0].wait(timeout=150), procs[1].wait(timeout=150)
    finally:
        lighthouse.shutdown()


@pytest.mark.timeout(240)
def test_a_bit_flipped_in_one_group_is_found_across_groups_and_every_group_stops(
    tmp_path: Path, data_cache_dir: Path
) -> None:
    codes = two_groups(tmp_path, data_cache_dir, "flip_param:5:0:2")  # group 1, after step 5
    assert codes[0] != 0 and codes[1] != 0, codes  # both stop for the rollback
    for g in (0, 1):
        found = rows(tmp_path / f"g{g}.jsonl", "sdc")
        # The first comparison after the flip (step 6); the one before it was clean.
        assert [r["step"] for r in found] == [6], found
        assert len(found[0]["nodes"]) == 1  # each group names its own rank's node
        assert "no majority" in found[0]["message"], found[0]["message"]
        assert [r["step"] for r in rows(tmp_path / f"g{g}.jsonl", "sdc_clean")][-1] == 4
        # Slow-node timing: this group's node and its update time, at every report.
        updates = rows(tmp_path / f"g{g}.jsonl", "node_update_s")
        assert updates and all(len(r["update_s"]) == 1 for r in updates)


@pytest.mark.timeout(240)
def test_a_non_finite_loss_in_one_group_stops_it_for_a_rollback(
    tmp_path: Path, data_cache_dir: Path
) -> None:
    # nan_at_step poisons the loss group 1 reports (after the cross-group sum): its own
    # anomaly check, the plain loop's, stops it; the service then rolls every group back
    # (tests/unit/reconcile/test_fast_path.py).
    codes = two_groups(tmp_path, data_cache_dir, "nan_at_step:7:0:2")
    assert codes[1] != 0, codes
    found = rows(tmp_path / "g1.jsonl", "anomaly")
    assert [(r["step"], r["figure"]) for r in found] == [(7, "loss")], found
    assert not rows(tmp_path / "g0.jsonl", "anomaly")


def four_groups(tmp: Path, data_cache_dir: Path, fault: str = "") -> list[int]:
    """Train four groups of one rank (paced 0.5 s a share, comparing every 4 steps), group
    0 first: the others start only once it has asked the lighthouse for its first quorum,
    as Slurm starts separate jobs seconds apart. Their exit codes."""
    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(
        bind="[::]:0", min_replicas=1, join_timeout_ms=1000, heartbeat_timeout_ms=1000
    )
    go = tmp / "go"
    try:
        procs = []
        for g in range(4):
            spec = tiny_spec(
                tmp / "ckpt",
                data_cache_dir,
                name="four",
                attempt_number=1 + g,
                steps=STEPS,
                global_batch=8,
                checkpoint_every=100,
                sdc_check_every=4,
                layout={"dp": 4, "micro_batch_size": 2, "zero_stage": 1},
                fault_tolerance={"group": g, "groups": 4, "lighthouse_addr": lighthouse.address()},
            )
            gate = [] if g == 0 else [str(go)]
            env = ",".join(filter(None, ("pace_step:1:*=0.5", fault)))
            procs.append(start_group(spec, tmp, f"g{g}", *gate, RUNYARD_FAULT=env))
        log = tmp / "g0.log"
        deadline = time.monotonic() + 120
        while "Start quorum" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, "group 0 never asked for a quorum"
            time.sleep(0.05)
        time.sleep(1.5)  # alone past the lighthouse's join timeout
        go.touch()
        return [p.wait(timeout=200) for p in procs]
    finally:
        lighthouse.shutdown()


@pytest.mark.timeout(300)
def test_four_groups_started_apart_train_one_timeline_and_compare_clean(
    tmp_path: Path, data_cache_dir: Path
) -> None:
    assert four_groups(tmp_path, data_cache_dir) == [0, 0, 0, 0]
    losses = [
        {r["step"]: r["loss"] for r in rows(tmp_path / f"g{g}.jsonl", "metric")} for g in range(4)
    ]
    # No group trained a step the others did not: the first one up waited for a majority.
    assert min(losses[0]) == 1 and all(losses[g] == losses[0] for g in range(1, 4)), losses
    for g in range(4):
        assert not rows(tmp_path / f"g{g}.jsonl", "sdc")
        assert [r["step"] for r in rows(tmp_path / f"g{g}.jsonl", "sdc_clean")] == [4, 8, 12]


@pytest.mark.timeout(300)
def test_a_group_outvoted_by_three_stops_alone_and_the_others_train_on(
    tmp_path: Path, data_cache_dir: Path
) -> None:
    codes = four_groups(tmp_path, data_cache_dir, "flip_param:5:0:3")  # group 2
    assert codes[2] != 0 and [codes[g] for g in (0, 1, 3)] == [0, 0, 0], codes
    [found] = rows(tmp_path / "g2.jsonl", "sdc")
    assert found["step"] == 8 and found["outvoted"] and len(found["nodes"]) == 1, found
    assert "outvoted" in found["message"], found["message"]
    for g in (0, 1, 3):  # the majority: clean at 8 too, and on to the last step
        assert not rows(tmp_path / f"g{g}.jsonl", "sdc")
        assert [r["step"] for r in rows(tmp_path / f"g{g}.jsonl", "sdc_clean")] == [4, 8, 12]
        assert max(r["step"] for r in rows(tmp_path / f"g{g}.jsonl", "metric")) == STEPS
