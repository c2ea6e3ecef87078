"""Launch the user's own training script (`entrypoint:` in a run spec) on this rank.

Each Slurm task of the attempt runs one copy of the script as its child, with the
torch.distributed variables torchrun would set (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR,
MASTER_PORT: the same rendezvous runyard's trainer uses) and runyard's own (runyard_client:
the service to report to, the checkpoint folder, the resume point). Slurm's time-limit
signal and a termination are passed on to the script. The script's exit code is the rank's:
0 done or stopped at a checkpoint, 3 (ExitCode.DO_NOT_RETRY) another attempt cannot help,
anything else retryable, as for runyard's trainer.

The script runs in the user's own Python when the spec names one (`environment.python`): this
launcher stays in runyard's environment, and supervision (signals, exit codes, reports)
stays runyard's. For a script that never imports runyard, rank 0's launcher reports for it:
the steps its output shows (`progress:`, worker/script_progress.py) and the checkpoints it
completes in the run's folder (`resume:`, worker/script_checkpoints.py), whose flags it
appends to the script's command line.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

from contract import ExitCode, WorkerRunConfig
from contract.entrypoint import script_python_environment
from worker import client
from worker.errors import DoNotRetryError
from worker.launch import LaunchEnv, cpu_threads
from worker.reporter import FileReporter, HttpReporter, Reporter
from worker.script_checkpoints import CheckpointWatcher
from worker.script_progress import OutputReader, ProgressParser, StepReports

FORWARDED_SIGNALS = (signal.SIGUSR2, signal.SIGTERM)  # time limit near; stop now
OUTPUT_DRAIN_S = 10.0  # after the script's exit, for a child of its own holding the pipe


class ScriptFailedError(RuntimeError):
    """The script exited non-zero: retryable, like any failure of runyard's trainer."""


def script_environment(
    config: WorkerRunConfig,
    launch: LaunchEnv,
    service_url: str | None,
    environ: Mapping[str, str] = os.environ,
) -> dict[str, str]:
    """The environment the script starts with: ours (without runyard's import path when it
    runs in the user's own Python), plus torchrun's variables (and its OMP_NUM_THREADS
    rule) and runyard's."""
    env = dict(environ)
    if config.environment is not None:
        env = script_python_environment(env, config.environment.python)
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
    # torchrun's thread rule, which the script's own launch would have had: a setting of
    # the user's own (in the environment the job carries) is kept.
    env.setdefault("OMP_NUM_THREADS", str(cpu_threads(environ)))
    if service_url is not None:
        env[client.ENV_SERVICE_URL] = service_url
    for stale in (client.ENV_RESUME_STEP, client.ENV_RESUME_PATH):
        env.pop(stale, None)
    if config.resume_from is not None:
        env[client.ENV_RESUME_STEP] = str(config.resume_from.step)
        env[client.ENV_RESUME_PATH] = config.resume_from.path
    return env


def script_argv(config: WorkerRunConfig) -> list[str]:
    """The script's command line: the spec's, in the spec's Python (or runyard's), then
    `<save_flag> <the run's folder>` and `<flag> <the resume point>` when the spec names
    the script's own flags (appended last, so they win over the same flags in args)."""
    if config.entrypoint is None:
        raise ValueError("the config names no entrypoint")
    python = config.environment.python if config.environment is not None else sys.executable
    argv = config.entrypoint.argv(python)
    if config.resume is not None:
        argv += [config.resume.save_flag, config.checkpoint_dir]
        if config.resume.flag is not None and config.resume_from is not None:
            if not Path(config.resume_from.path).exists():
                raise DoNotRetryError(
                    f"the resume point {config.resume_from.path} (step "
                    f"{config.resume_from.step}) is gone from the run's checkpoint folder"
                )
            argv += [config.resume.flag, config.resume_from.path]
    return argv


def launcher_reporter(
    config: WorkerRunConfig,
    launch: LaunchEnv,
    service_url: str | None,
    environ: Mapping[str, str] = os.environ,
) -> Reporter:
    """Who rank 0's launcher reports a script's progress and checkpoints to: the service,
    or standalone $RUNYARD_METRICS_FILE (as runyard_client's connect() chooses), or no one."""
    if service_url is not None:
        return HttpReporter(
            service_url, config.attempt_id, node=launch.node, interval_s=config.report_interval_s
        )
    if client.ENV_METRICS_FILE in environ:
        return FileReporter(Path(environ[client.ENV_METRICS_FILE]))
    return Reporter()


def _start(argv: list[str], env: dict[str, str], *, piped: bool = False) -> subprocess.Popen[bytes]:
    """Start the script (its output `piped` to us); an interpreter this rank cannot run
    fails every attempt alike."""
    pipe = subprocess.PIPE if piped else None
    try:
        return subprocess.Popen(argv, env=env, stdout=pipe, stderr=pipe)
    except (FileNotFoundError, PermissionError) as exc:
        raise DoNotRetryError(f"cannot run {argv[0]} on this node: {exc.strerror}") from exc


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
    argv = script_argv(config)
    env = script_environment(config, launch, service_url)
    if launch.rank == 0:
        print(f"runyard: launching {' '.join(argv)} on {launch.world_size} ranks", flush=True)
    if launch.rank == 0 and (config.progress is not None or config.resume is not None):
        code = _run_reporting_for_it(config, launch, service_url, argv, env)
    else:
        child = _start(argv, env)
        with _forwarding(child):
            code = child.wait()
    if code == ExitCode.OK:
        return
    if code == ExitCode.DO_NOT_RETRY:
        raise DoNotRetryError(f"the entrypoint {' '.join(argv)} exited with {code}")
    raise ScriptFailedError(f"the entrypoint {' '.join(argv)} exited with {code}")


def _run_reporting_for_it(
    config: WorkerRunConfig,
    launch: LaunchEnv,
    service_url: str | None,
    argv: list[str],
    env: dict[str, str],
) -> int:
    """Rank 0 of a script that never imports runyard: run it with its output piped through
    this process, report the steps it prints and commit the checkpoints it completes; when
    it exited 0 having trained every step, tell the service the run is done. Its exit code."""
    reporter = launcher_reporter(config, launch, service_url)
    after_step = config.resume_from.step if config.resume_from is not None else 0
    watcher = None
    if config.resume is not None:  # before the start: what is there already is not its
        watcher = CheckpointWatcher(Path(config.checkpoint_dir), reporter, after_step)
        watcher.start()
    steps = StepReports(reporter, after_step, time.monotonic)
    readers: list[OutputReader] = []
    try:
        if config.progress is None:
            child = _start(argv, env)
        else:
            # Unbuffered: a step line must reach us when printed, not a pipe buffer later.
            env = env | {"PYTHONUNBUFFERED": "1"}
            child = _start(argv, env, piped=True)
            parser = ProgressParser(config.progress)
            assert child.stdout is not None and child.stderr is not None
            readers = [
                OutputReader(child.stdout, sys.stdout.buffer, parser, steps),
                OutputReader(child.stderr, sys.stderr.buffer, parser, steps),
            ]
        with _forwarding(child):
            code = child.wait()
        for reader in readers:
            reader.join(OUTPUT_DRAIN_S)
        if watcher is not None:
            watcher.stop(script_exited_ok=code == ExitCode.OK)
        committed = watcher.last_step if watcher is not None else 0
        final_step = max(steps.last_step, committed)
        if code == ExitCode.OK and final_step >= config.steps:
            reporter.finish(final_step, committed)
        return code
    finally:
        reporter.close()
