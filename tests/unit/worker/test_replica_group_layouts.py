"""Replica groups of every layout: two groups, one lost, the other trains on, a replacement
heals, and every step's loss is the single-group run's.

One torchrun launch of four gloo ranks (layout_driver.py) trains, for each layout of
LAYOUTS, a run of two replica groups of two ranks each, each group laid out as the run's
layout with half its data parallel: FSDP (ZeRO-3) over 2, tp 2, pp 2 with two virtual
stages per rank (interleaved 1F1B), cp 2. Group 1 raises at step DIES_AT in both its ranks
(RUNYARD_FAULT), so its peers' collectives fail; group 0 trains on alone (the whole global
batch, both shares) until it has reported step ALONE_UNTIL; then group 1's ranks come back
as the replacement, which heals from group 0 over torchft's HTTP transport and trains to
the end beside it. The reference is the hand-written single-process loop over the same
global batch (test_worker_layouts.reference_losses).

Tolerance: fp32; the groups sum the same rows in another order (a share per group, then the
groups), so losses agree to float rounding, amplified a little by Adam over the steps.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_worker_layouts import DEEP_MODEL, MODEL, layout_spec, read_losses, reference_losses
from worker_helpers import clean_env, free_port

# Ranks as processes training together: make test-all (make test keeps the whole paths).
pytestmark = pytest.mark.heavy

REPO_ROOT = Path(__file__).resolve().parents[3]
STEPS = 14
DIES_AT = 4  # group 1's last step before it is lost
ALONE_UNTIL = 7  # group 0 reports this step alone before the replacement starts
LOSS_RTOL = 1e-4
# The survivor's steps take at least this long (RUNYARD_FAULT pace_step), so that it is
# still training when the replacement has started, however fast this machine is.
PACE_S = 0.4

# name -> (the run's layout: two groups of two ranks, each with half its dp; model)
LAYOUTS: dict[str, tuple[dict[str, Any], dict[str, int]]] = {
    "fsdp2": ({"dp": 4, "zero_stage": 3, "micro_batch_size": 1}, MODEL),
    "tp2": ({"dp": 2, "tp": 2, "micro_batch_size": 4}, MODEL),
    "pp2_vp2": ({"dp": 2, "pp": 2, "vp": 2, "schedule": "interleaved_1f1b",
                 "micro_batch_size": 2}, DEEP_MODEL),
    "cp2": ({"dp": 2, "cp": 2, "micro_batch_size": 4}, MODEL),
}  # fmt: skip


@pytest.fixture(scope="module")
def lighthouses() -> Iterator[dict[str, str]]:
    """One torchft lighthouse per scenario, as the service starts one per run."""
    from torchft._torchft import LighthouseServer

    servers = {
        name: LighthouseServer(
            bind="[::]:0", min_replicas=1, join_timeout_ms=1000, heartbeat_timeout_ms=1000
        )
        for name in LAYOUTS
    }
    yield {name: server.address() for name, server in servers.items()}
    for server in servers.values():
        server.shutdown()


@pytest.fixture(scope="module")
def runs(
    tmp_path_factory: pytest.TempPathFactory, data_cache_dir: Path, lighthouses: dict[str, str]
) -> dict[str, dict[str, dict[int, float]]]:
    root = tmp_path_factory.mktemp("replica-layouts")
    scenarios, faults = [], []
    for name, (layout, model) in LAYOUTS.items():
        run = f"ft-{name}"
        config = layout_spec(root, data_cache_dir, run, layout=layout, steps=STEPS, model=model,
                             checkpoint_every=1000, report_interval_s=1e-3)  # fmt: skip
        config["name"] = run  # the faults name the run
        scenarios.append({
            "name": name, "config": config, "lighthouse": lighthouses[name],
            "metrics": str(root / f"{name}.jsonl"), "store": str(root / f"{name}.store"),
            "ports": [free_port() for _ in range(3)], "alone_until": ALONE_UNTIL,
        })  # fmt: skip
        # Group 1's first attempt (attempt 2) is lost; group 0's (attempt 1) is paced.
        faults += [f"raise_after_step:{DIES_AT}:*:2@{run}", f"pace_step:1:*:1@{run}={PACE_S}"]
    plan = root / "plan.json"
    plan.write_text(json.dumps({"store": str(root / "store"), "scenarios": [],
                                "replica_scenarios": scenarios}))  # fmt: skip
    driver = Path(__file__).with_name("layout_driver.py")
    launch = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=4",
         str(driver), str(plan)],
        # Checkpoints written from a thread: DCP's process-based writer (the default) starts
        # a process with a process group of its own, which does not survive this driver's
        # re-forming of groups inside one process (a SIGSEGV at the first scenario's end);
        # a Slurm task trains once and exits.
        env=clean_env(
            PYTHONPATH=str(REPO_ROOT),
            RUNYARD_FAULT=",".join(faults),
            RUNYARD_CHECKPOINT_WRITER="thread",
        ),
        capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    (root / "launch.log").write_text(launch.stdout + launch.stderr)
    assert launch.returncode == 0, f"{root / 'launch.log'}: {launch.stderr[-3000:]}"
    return {
        s["name"]: {
            part: read_losses(Path(f"{s['metrics']}.{part}"))
            for part in ("g0", "g1", "g1b")
            if Path(f"{s['metrics']}.{part}").exists()
        }
        for s in scenarios
    }


@pytest.mark.timeout(900)
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_a_lost_group_is_healed_and_losses_match_a_single_group(
    name: str, runs: dict[str, dict[str, dict[int, float]]], data_cache_dir: Path
) -> None:
    got = runs[name]
    survivor, lost, healed = got["g0"], got.get("g1", {}), got.get("g1b", {})
    # The survivor trained every step once, through the loss of group 1, to the end. Both
    # groups start at step 0 without a sync (fault_tolerance.py, init_sync=False): a group
    # that reaches the first quorum more than the join timeout after the other (a loaded
    # machine, or two Slurm jobs starting apart) heals from it at its step, as a replacement
    # does; so either group's first step may be past 1, but they trained side by side
    # before group 1 was lost.
    first = min(survivor)
    assert sorted(survivor) == list(range(first, STEPS + 1)), sorted(survivor)
    # Group 1 trained with it up to its loss; the replacement started past the point where
    # group 0 was alone (it healed, it did not start from scratch) and trained to the end.
    assert sorted(lost) == list(range(min(lost), DIES_AT + 1)), sorted(lost)
    assert max(first, min(lost)) <= DIES_AT, ("never side by side", sorted(survivor))
    assert healed and min(healed) > ALONE_UNTIL and max(healed) == STEPS, sorted(healed)
    expected = reference_losses(LAYOUTS[name][1], STEPS, data_cache_dir)
    for part in (survivor, lost, healed):
        for step, loss in part.items():
            assert loss == pytest.approx(expected[step], rel=LOSS_RTOL), (name, step)
