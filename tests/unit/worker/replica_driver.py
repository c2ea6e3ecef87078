"""One replica group's rank outside Slurm, for the fault-tolerance tests:
    python tests/unit/worker/replica_driver.py SPEC_JSON METRICS_FILE
(the launcher variables RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT in the env)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from contract import WorkerRunConfig
from worker.distributed import read_launch_env
from worker.fault_tolerance import train_replica_group
from worker.reporter import FileReporter

if __name__ == "__main__":
    torch.set_num_threads(1)
    config = WorkerRunConfig.model_validate(json.loads(Path(sys.argv[1]).read_text()))
    train_replica_group(config, read_launch_env(), FileReporter(Path(sys.argv[2])))
