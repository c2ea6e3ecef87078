"""Train several layouts in one torchrun launch: `python -m torch.distributed.run
--nproc-per-node 4 layout_driver.py PLAN.json`.

Starting four processes costs seconds each time on a two-core machine, so the layout tests
start them once and train every 4-rank scenario of the plan in the same process group, one
after another, then re-form a 2-rank group from ranks 0 and 1 for the 2-rank scenarios.
PLAN.json: {"store": path, "scenarios": [{"name", "world_size", "metrics", "config",
"stop_after"}, ...], "replica_scenarios": [...]}; with stop_after N, rank 0 asks to stop as
the service would cancel a run, and training ends after step N + 1 (with a checkpoint, as
on a cancel).

Replica scenarios (after the others): ranks 0-1 are replica group 0 and ranks 2-3 group 1
of a run whose `config` is the whole run's (its layout spans both groups), each group its
own process group on its own TCPStore, as two Slurm jobs would be, and its torchft link to
the lighthouse at `lighthouse`. Group 1 trains as attempt 2 and RUNYARD_FAULT (the test
sets it) raises in both its ranks at some step: the group is lost, its links dropped. Its
ranks then wait until group 0's rank 0 has reported step `alone_until` (group 0 trained on
alone) and come back as the replacement (attempt 3, heal_from_peer), which heals from
group 0. Metrics go to `metrics` + ".g0", ".g1", ".g1b".
"""

from __future__ import annotations

import gc
import json
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from contract import WorkerRunConfig
from worker.cross_group import CrossGroupSync
from worker.distributed import init_distributed
from worker.fault_tolerance import ReplicaGroupSync
from worker.faults import InjectedFault, fault_points_from_env
from worker.launch import LaunchEnv
from worker.reporter import FileReporter, Reporter
from worker.train import train_loop

GROUP_SIZE = 2


class StopAfter(FileReporter):
    """Records like FileReporter; after step `at` asks the loop to stop, like a cancel."""

    def __init__(self, path: Path, at: int | None) -> None:
        super().__init__(path)
        self.at = at

    def metric(self, step: int, loss: float, *figures: Any, **named: Any) -> None:
        super().metric(step, loss, *figures, **named)
        self.cancel_requested = self.cancel_requested or step == self.at


class SaysWhenAlone(FileReporter):
    """Records like FileReporter; sets `alone` in `store` once step `at` is reported."""

    def __init__(self, path: Path, store: dist.Store, at: int) -> None:
        super().__init__(path)
        self.store, self.at = store, at

    def metric(self, step: int, loss: float, *figures: Any, **named: Any) -> None:
        super().metric(step, loss, *figures, **named)
        if step >= self.at:
            self.store.set("alone", "1")


def run(plan: dict[str, Any]) -> None:
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    world_size = dist.get_world_size()
    for size in sorted({s["world_size"] for s in plan["scenarios"]}, reverse=True):
        if size != world_size:
            # Re-form a smaller world from the first `size` ranks; the others are done.
            dist.destroy_process_group()
            if rank >= size:
                return
            store = dist.FileStore(f"{plan['store']}.{size}", size)
            dist.init_process_group("gloo", store=store, rank=rank, world_size=size)
            world_size = size
        for scenario in [s for s in plan["scenarios"] if s["world_size"] == size]:
            config = WorkerRunConfig.model_validate(scenario["config"])
            reporter: Reporter = Reporter()
            if rank == 0:
                reporter = StopAfter(Path(scenario["metrics"]), scenario.get("stop_after"))
            points = fault_points_from_env(config.name, config.attempt_number)  # as train()
            train_loop(config, reporter, torch.device("cpu"), fault_points=points)
    dist.destroy_process_group()
    for scenario in plan.get("replica_scenarios", []):
        if rank < 2 * GROUP_SIZE:
            run_replica_groups(scenario, rank)


def _train_group(
    scenario: dict[str, Any], rank: int, attempt: int, port: int, reporter: Reporter
) -> None:
    """Train one replica group's rank in its own process group, as train() does."""
    group, group_rank = divmod(rank, GROUP_SIZE)
    ft = {"group": group, "groups": 2, "lighthouse_addr": scenario["lighthouse"]}
    ft |= {"heal_from_peer": attempt == 3, "timeout_s": 5.0}
    raw = scenario["config"] | {"attempt_number": attempt, "fault_tolerance": ft}
    config = WorkerRunConfig.model_validate(raw)
    points = fault_points_from_env(config.name, config.attempt_number)  # as train() does
    launch = LaunchEnv("slurm", group_rank, GROUP_SIZE, group_rank, "127.0.0.1", port, "")
    init_distributed(launch, torch.device("cpu"))
    sync: CrossGroupSync = ReplicaGroupSync(config.fault_tolerance, 1, "127.0.0.1", port)
    try:
        train_loop(config, reporter, torch.device("cpu"), sync=sync, fault_points=points)
        sync.close(failed=False)
    except InjectedFault as exc:  # the group is lost: its peers must learn at once
        print(f"rank {rank}: replica group {group} lost at {exc}", flush=True)
        traceback.clear_frames(exc.__traceback__)  # frees the model before its groups
        sync.close(failed=True)
    finally:
        dist.destroy_process_group()


def run_replica_groups(scenario: dict[str, Any], rank: int) -> None:
    """Two replica groups of the scenario's run; group 1 is lost and replaced."""
    group, group_rank = divmod(rank, GROUP_SIZE)
    coordinator = dist.FileStore(f"{scenario['store']}", 2 * GROUP_SIZE)
    coordinator.set_timeout(timedelta(seconds=300))
    metrics = Path(scenario["metrics"])
    reporter: Reporter = Reporter()
    if group_rank == 0 and group == 0:
        reporter = SaysWhenAlone(Path(f"{metrics}.g0"), coordinator, scenario["alone_until"])
    elif group_rank == 0:
        reporter = FileReporter(Path(f"{metrics}.g1"))
    ports = scenario["ports"]
    _train_group(scenario, rank, 1 + group, ports[group], reporter)
    if group == 1:
        coordinator.wait(["alone"])  # group 0 trained on alone for a while
        if group_rank == 0:
            reporter = FileReporter(Path(f"{metrics}.g1b"))
        _train_group(scenario, rank, 3, ports[2], reporter)
    coordinator.set(f"done{rank}", "1")
    coordinator.wait([f"done{r}" for r in range(2 * GROUP_SIZE)])


if __name__ == "__main__":
    gc.freeze()  # what the imports made lives as long as the process (worker/imports.py)
    torch.set_num_threads(1)
    run(json.loads(Path(sys.argv[1]).read_text()))
