"""Train several layouts in one torchrun launch: `python -m torch.distributed.run
--nproc-per-node 4 layout_driver.py PLAN.json`.

Starting four processes costs seconds each time on a two-core machine, so the layout tests
start them once and train every 4-rank scenario of the plan in the same process group, one
after another, then re-form a 2-rank group from ranks 0 and 1 for the 2-rank scenarios.
PLAN.json: {"store": path, "scenarios": [{"name", "world_size", "metrics", "config",
"stop_after"}, ...]}; with stop_after N, rank 0 asks to stop as the service would cancel a
run, and training ends after step N + 1 (with a checkpoint, as on a cancel).
"""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from contract import WorkerRunConfig
from worker.reporter import FileReporter, Reporter
from worker.train import train_loop


class StopAfter(FileReporter):
    """Records like FileReporter; after step `at` asks the loop to stop, like a cancel."""

    def __init__(self, path: Path, at: int | None) -> None:
        super().__init__(path)
        self.at = at

    def metric(self, step: int, loss: float, tokens_per_s: float, step_time_s: float) -> None:
        super().metric(step, loss, tokens_per_s, step_time_s)
        self.cancel_requested = self.cancel_requested or step == self.at


def run(plan: dict) -> None:
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
            train_loop(config, reporter, torch.device("cpu"))
    dist.destroy_process_group()


if __name__ == "__main__":
    gc.freeze()  # what the imports made lives as long as the process (worker/imports.py)
    torch.set_num_threads(1)
    run(json.loads(Path(sys.argv[1]).read_text()))
