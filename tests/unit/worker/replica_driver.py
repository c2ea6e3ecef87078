"""One replica group's rank outside Slurm, for the fault-tolerance tests:
    python tests/unit/worker/replica_driver.py SPEC_JSON METRICS_FILE [GO_FILE]
(the launcher variables RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT in the env).

With GO_FILE it imports and starts everything first, then waits for the file before
training: a replacement on a warm spare, so the test does not race Python's start-up.
REPLICA_STEP_DELAY_S slows every step down (after it is committed), so that a survivor is
still training when its peer's replacement arrives, however fast this machine is.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import time
from pathlib import Path

import torch

from contract import WorkerRunConfig
from worker import fault_tolerance
from worker.distributed import read_launch_env
from worker.fault_tolerance import train_replica_group
from worker.reporter import FileReporter

if __name__ == "__main__":
    gc.freeze()  # what the imports made lives as long as the process (worker/imports.py)
    torch.set_num_threads(1)
    config = WorkerRunConfig.model_validate(json.loads(Path(sys.argv[1]).read_text()))
    delay = float(os.environ.get("REPLICA_STEP_DELAY_S", "0"))
    crash = fault_tolerance.maybe_crash

    def slow_crash(point: str, step: int, rank: int) -> None:
        crash(point, step, rank)
        time.sleep(delay)

    fault_tolerance.maybe_crash = slow_crash  # type: ignore[assignment]
    if len(sys.argv) > 3:
        while not Path(sys.argv[3]).exists():
            time.sleep(0.02)
    train_replica_group(config, read_launch_env(), FileReporter(Path(sys.argv[2])))
