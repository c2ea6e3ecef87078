"""Three gloo ranks, one launch, two scenarios of issue 15 (test_worker_slow_and_sdc.py):
`python -m torch.distributed.run --nproc-per-node 3 health_driver.py PLAN.json`.

Each rank names its own node (SLURMD_NODENAME node<rank>), as three Slurm nodes would.
PLAN.json: {"scenarios": [{"name", "fault", "metrics", "config"}, ...]}; a scenario that
ends in SilentDataCorruptionError writes "<metrics>.sdc.<rank>" on every rank that raised.
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
from worker.faults import fault_points_from_env
from worker.reporter import FileReporter, Reporter
from worker.sdc import SilentDataCorruptionError
from worker.train import train_loop


def run(plan: dict) -> None:
    rank = int(os.environ["RANK"])
    os.environ["SLURMD_NODENAME"] = f"node{rank}"
    dist.init_process_group("gloo")
    for scenario in plan["scenarios"]:
        config = WorkerRunConfig.model_validate(scenario["config"])
        # The scenario's faults, read as train() reads RUNYARD_FAULT at a rank's start.
        environ = {"RUNYARD_FAULT": scenario["fault"]}
        points = fault_points_from_env(config.name, config.attempt_number, environ)
        metrics = Path(scenario["metrics"])
        reporter: Reporter = FileReporter(metrics) if rank == 0 else Reporter()
        try:
            train_loop(config, reporter, torch.device("cpu"), fault_points=points)
        except SilentDataCorruptionError as exc:
            Path(f"{metrics}.sdc.{rank}").write_text(str(exc))
    dist.destroy_process_group()


if __name__ == "__main__":
    gc.freeze()  # what the imports made lives as long as the process (worker/imports.py)
    run(json.loads(Path(sys.argv[1]).read_text()))
