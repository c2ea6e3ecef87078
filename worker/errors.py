"""Worker errors, each carrying the exit code the service's recovery loop acts on."""

from __future__ import annotations

from contract import ExitCode


class WorkerError(Exception):
    """Base of the worker's own errors. Anything else that escapes is RETRYABLE too."""

    exit_code: int = ExitCode.RETRYABLE


class DoNotRetryError(WorkerError, ValueError):
    """The spec (or the code) is wrong: another attempt on fresh nodes would fail the same way."""

    exit_code = ExitCode.DO_NOT_RETRY


class UnsupportedLayoutError(DoNotRetryError):
    """A layout this worker's hardware cannot train (fp8 without FP8 tensor cores)."""


class CheckpointNotCommittedError(DoNotRetryError):
    """Asked to resume from a checkpoint folder that has no COMMITTED marker."""
