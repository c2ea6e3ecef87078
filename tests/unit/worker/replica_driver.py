"""One replica group's rank outside Slurm, for the fault-tolerance tests:
    python tests/unit/worker/replica_driver.py SPEC_JSON METRICS_FILE [GO_FILE]
(the launcher variables RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT in the env).

It trains through worker.train.train, as a Slurm task does: a spec with fault_tolerance is
one replica group of its run. With GO_FILE it imports and starts everything first, then
waits for the file before training: a replacement on a warm spare, so the test does not race
Python's start-up. Steps are slowed with RUNYARD_FAULT's pace_step, like any test's.
"""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

import torch

from contract import WorkerRunConfig
from worker.launch import read_launch_env
from worker.reporter import FileReporter
from worker.train import train

if __name__ == "__main__":
    gc.freeze()  # what the imports made lives as long as the process (worker/imports.py)
    torch.set_num_threads(1)
    config = WorkerRunConfig.model_validate(json.loads(Path(sys.argv[1]).read_text()))
    if len(sys.argv) > 3:
        while not Path(sys.argv[3]).exists():
            time.sleep(0.02)
    train(config, read_launch_env(), FileReporter(Path(sys.argv[2])))
