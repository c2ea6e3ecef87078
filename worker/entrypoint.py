"""Launch the user's own training script (`entrypoint:` in a run spec) on this rank.

Each Slurm task of the attempt runs one copy of the script as its child, with the
torch.distributed variables torchrun would set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT: the same rendezvous runyard's trainer uses) and runyard's own (worker/client.py:
the service to report to, the checkpoint folder, the resume point). Slurm's time-limit
signal and a termination are passed on to the script. The script's exit code is the rank's:
0 done or stopped at a checkpoint, 3 (ExitCode.DO_NOT_RETRY) another attempt cannot help,
anything else retryable, as for runyard's trainer.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager

from contract import ExitCode, WorkerRunConfig
from worker import client
from worker.distributed import LaunchEnv
from worker.errors import DoNotRetryError

FORWARDED_SIGNALS = (signal.SIGUSR2, signal.SIGTERM)  # time limit near; stop now


class ScriptFailedError(RuntimeError):
    """The script exited non-zero: retryable, like any failure of runyard's trainer."""


def script_environment(
    config: WorkerRunConfig,
    launch: LaunchEnv,
    service_url: str | None,
    environ: Mapping[str, str] = os.environ,
) -> dict[str, str]:
    """The environment the script starts with: ours, plus torchrun's variables and runyard's."""
    env = dict(environ)
    env.update(
        {
            "RANK": str(launch.rank),
            "WORLD_SIZE": str(launch.world_size),
            "LOCAL_RANK": str(launch.local_rank),
            "MASTER_ADDR": launch.master_addr,
            "MASTER_PORT": str(launch.master_port),
            client.ENV_ATTEMPT_ID: str(config.attempt_id),
            client.ENV_NODE: launch.node,
            client.ENV_CHECKPOINT_DIR: config.checkpoint_dir,
            client.ENV_STEPS: str(config.steps),
            client.ENV_REPORT_INTERVAL_S: str(config.report_interval_s),
        }
    )
    if service_url is not None:
        env[client.ENV_SERVICE_URL] = service_url
    for stale in (client.ENV_RESUME_STEP, client.ENV_RESUME_PATH):
        env.pop(stale, None)
    if config.resume_from is not None:
        env[client.ENV_RESUME_STEP] = str(config.resume_from.step)
        env[client.ENV_RESUME_PATH] = config.resume_from.path
    return env


@contextmanager
def _forwarding(child: subprocess.Popen[bytes]) -> Iterator[None]:
    """Pass Slurm's signals on to the script while it runs (main thread only can)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {
        signum: signal.signal(signum, lambda signum, _: child.send_signal(signum))
        for signum in FORWARDED_SIGNALS
    }
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run_entrypoint(config: WorkerRunConfig, launch: LaunchEnv, service_url: str | None) -> None:
    """Run the script on this rank until it exits; raise unless it exited 0."""
    if config.entrypoint is None:
        raise ValueError("the config names no entrypoint")
    argv = config.entrypoint.argv(sys.executable)
    env = script_environment(config, launch, service_url)
    if launch.rank == 0:
        print(f"runyard: launching {' '.join(argv)} on {launch.world_size} ranks", flush=True)
    child = subprocess.Popen(argv, env=env)
    with _forwarding(child):
        code = child.wait()
    if code == ExitCode.OK:
        return
    if code == ExitCode.DO_NOT_RETRY:
        raise DoNotRetryError(f"the entrypoint {' '.join(argv)} exited with {code}")
    raise ScriptFailedError(f"the entrypoint {' '.join(argv)} exited with {code}")
