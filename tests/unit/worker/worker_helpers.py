"""Helpers for the worker tests (named uniquely: `conftest` modules collide across folders)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Re-exported: the worker tests take it from here.
from tests.conftest import free_port as free_port

REPO_ROOT = Path(__file__).resolve().parents[3]
TINY_MODEL = {"layers": 2, "hidden": 128, "heads": 4, "kv_heads": 2, "ffn": 384, "vocab": 256}


def tiny_spec(checkpoint_dir: Path, data_cache_dir: Path, **overrides: Any) -> dict[str, Any]:
    """A WorkerRunConfig dict small enough to train in seconds on two CPU cores."""
    spec: dict[str, Any] = {
        "run_id": 1,
        "attempt_id": 1,
        "attempt_number": 1,
        "name": "tiny",
        "model": TINY_MODEL,
        "layout": {"dp": 1, "micro_batch_size": 8},
        "seq_len": 64,
        "global_batch": 8,
        "steps": 12,
        "lr": 3e-3,
        "warmup_steps": 3,
        "checkpoint_every": 5,
        "keep_checkpoints": 2,
        "checkpoint_dir": str(checkpoint_dir),
        "data_cache_dir": str(data_cache_dir),
        "report_interval_s": 0.1,
    }
    spec.update(overrides)
    return spec


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without launcher variables (pytest might run under srun)."""
    launcher = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "RUNYARD_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", *launcher))}
    return env | {"OMP_NUM_THREADS": "1"} | extra  # ranks share two cores


def run_launchers(config: Path, metrics: Path, timeout_s: float = 120) -> None:
    """Two ranks of entrypoint_driver.py on `config`, as two Slurm tasks run the launcher,
    until both exit 0; rank 0's reports land in `metrics`.

    Each rank's output goes to a file, not a pipe: a pipe nobody reads while waiting on the
    other rank would fill and stop that rank inside a collective. A rank still running at
    `timeout_s` prints every thread's stack (faulthandler, SIGABRT to its process group,
    the script included) into the failure."""
    driver, port = Path(__file__).with_name("entrypoint_driver.py"), str(free_port())
    env = clean_env(PYTHONPATH=f"{REPO_ROOT}:{Path(__file__).parent}", PYTHONFAULTHANDLER="1")
    env["RUNYARD_METRICS_FILE"] = str(metrics)
    logs = [metrics.with_name(f"{metrics.stem}.rank{rank}.log") for rank in range(2)]
    ranks = []
    for rank, log in enumerate(logs):
        with log.open("w") as out:
            argv = [sys.executable, str(driver), str(config), str(rank), "2", port]
            ranks.append(subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT,
                                          start_new_session=True))  # fmt: skip
    deadline = time.monotonic() + timeout_s
    try:
        for rank in ranks:
            rank.wait(timeout=max(deadline - time.monotonic(), 0.1))
    except subprocess.TimeoutExpired:
        for rank in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(rank.pid, signal.SIGABRT)
        time.sleep(2)  # the stacks written
    finally:
        for rank in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(rank.pid, signal.SIGKILL)
            rank.wait()
    tails = "\n".join(f"--- rank {i}\n{log.read_text()[-6000:]}" for i, log in enumerate(logs))
    assert [rank.returncode for rank in ranks] == [0, 0], tails


@dataclass
class FakeService:
    """The worker endpoints of the service over real HTTP, recording what it receives.

    The real service is built elsewhere; this stands in for it with the same paths and
    bodies, and can be told to fail the first N requests of a path to test retries."""

    url: str = ""
    config: dict[str, Any] | None = None
    run_state: str = "RUNNING"
    progress_reply: dict[str, Any] = field(default_factory=dict)  # more of the progress ack
    fail_first: dict[str, int] = field(default_factory=dict)  # path suffix -> failures left
    failure_status: int = 503  # what those failures answer
    received: list[tuple[str, dict[str, Any], dict[str, str]]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def bodies(self, suffix: str) -> list[dict[str, Any]]:
        with self.lock:
            return [body for path, body, _ in self.received if path.endswith(suffix)]

    def _should_fail(self, path: str) -> bool:
        with self.lock:
            for suffix, left in self.fail_first.items():
                if path.endswith(suffix) and left > 0:
                    self.fail_first[suffix] = left - 1
                    return True
        return False
