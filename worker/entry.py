"""What the service submits through submitit: one call per Slurm task.

The service pickles `run_attempt` by reference, so importing this module must stay cheap and
must not import torch (the service never installs it); everything heavy is imported inside.
By hand, under srun:
    srun -N2 --ntasks-per-node=2 python -m worker.entry --service-url http://svc:8000 --attempt-id 7
"""

from __future__ import annotations

import argparse
import os
import sys

from contract import ExitCode


def run_attempt(service_url: str, attempt_id: int) -> None:
    """Fetch this attempt's config, join the job's process group, train, report.

    Exits with ExitCode.DO_NOT_RETRY when the spec cannot work (unsupported layout, invalid
    config, a resume point that was never committed); any other failure propagates as an
    exception (non-zero exit: RETRYABLE for the service), after a collective failure (a
    dead peer, a timeout) is first reported to POST .../errors.
    """
    from worker.errors import DoNotRetryError
    from worker.failures import classify_collective_error
    from worker.reporter import HttpReporter, Reporter, fetch_config, post_error

    try:
        config = fetch_config(service_url, attempt_id)
        if config.attempt_id != attempt_id:
            raise DoNotRetryError(
                f"service sent attempt {config.attempt_id}'s config for attempt {attempt_id}"
            )
        from worker.launch import read_launch_env

        if config.entrypoint is not None:  # the user's own script, which reports itself
            from worker.entrypoint import run_entrypoint

            # No torch in this launcher: the script imports its own, in its own process.
            run_entrypoint(config, read_launch_env(), service_url)
            return
        from worker.imports import import_long_lived

        # runyard's trainer, from here on: torch._dynamo comes with the first optimizer.
        import_long_lived("torch", "torch._dynamo", "torch.distributed", "worker.distributed")
        from worker.train import train  # a replica group's too (config.fault_tolerance)

        launch = read_launch_env()
        reporter: Reporter = Reporter()
        if launch.rank == 0:  # rank 0 reports progress; other ranks only report their errors
            reporter = HttpReporter(
                service_url, attempt_id, node=launch.node, interval_s=config.report_interval_s
            )
        try:
            train(config, launch, reporter)
        except Exception as exc:
            # A peer died or the network failed: say so before exiting, so the run's
            # timeline shows the cause and not only "exit code 1".
            # Any other exception is reported too, with the step it happened at (or the
            # checkpoint it failed to load): the same one at the same step after a restart
            # is deterministic, and the service stops retrying it (recovery/restart.py).
            kind, step = classify_collective_error(exc), None
            if kind is None and hasattr(exc, "runyard_load_step"):
                kind, step = "worker:checkpoint_load", exc.runyard_load_step
            elif kind is None:
                kind, step = "worker:exception", getattr(exc, "runyard_step", None)
            post_error(
                service_url,
                attempt_id,
                rank=launch.rank,
                node=launch.node,
                kind=kind,
                message=f"{type(exc).__name__}: {exc}",
                step=step,
            )
            raise
        finally:
            reporter.close()
    except DoNotRetryError as exc:
        print(f"runyard worker: {exc}", file=sys.stderr, flush=True)
        # The exit code alone does not reach the service (submitit's wrapper turns every
        # failure into 1), so say it: recovery must not burn restarts on a bad spec.
        rank = int(os.environ.get("SLURM_PROCID", os.environ.get("RANK", "0")))
        node = os.environ.get("SLURMD_NODENAME", "")
        post_error(
            service_url,
            attempt_id,
            rank=rank,
            node=node,
            kind="worker:do_not_retry",
            message=str(exc),
        )
        sys.exit(ExitCode.DO_NOT_RETRY)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m worker.entry", description="Run one attempt.")
    parser.add_argument("--service-url", required=True)
    parser.add_argument("--attempt-id", type=int, required=True)
    args = parser.parse_args(argv)
    run_attempt(args.service_url, args.attempt_id)


if __name__ == "__main__":
    main()
