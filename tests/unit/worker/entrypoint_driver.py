"""One rank of an attempt whose spec names an entrypoint, as a Slurm task runs it:
`python entrypoint_driver.py CONFIG.json RANK WORLD_SIZE PORT` launches the script through
worker/entrypoint.py (standalone: no service, rank 0's reports go to $RUNYARD_METRICS_FILE)."""

from __future__ import annotations

import sys
from pathlib import Path

from contract import WorkerRunConfig
from worker.entrypoint import run_entrypoint
from worker.launch import LaunchEnv

if __name__ == "__main__":
    config_path, rank, world_size, port = sys.argv[1:5]
    config = WorkerRunConfig.model_validate_json(Path(config_path).read_text())
    launch = LaunchEnv("slurm", int(rank), int(world_size), int(rank), "127.0.0.1", int(port), "n")
    run_entrypoint(config, launch, service_url=None)
