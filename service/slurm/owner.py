"""A run's owner as the OS and Slurm know them, and what can go wrong acting as them.

Part of the Slurm seam: every job is submitted as its owner and charged to their account.
Who a run's owner is, service/identity/ decides."""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from service.slurm.commands import SlurmError


@dataclass(frozen=True)
class RunOwner:
    """The Unix user a run's ranks and scripts run as, and the Slurm account (and QoS, where
    the site maps priorities to one) its jobs are charged to."""

    unix_user: str
    slurm_account: str
    qos: str | None = None


class OwnerFailure(StrEnum):
    """Why an operation as the owner did not happen (the helper's answer, or sudo's)."""

    DENIED = "denied"  # the OS said no: the owner may not read or write that path
    MISSING = "missing"  # no such file or folder
    NOT_THEIRS = "not_theirs"  # a run folder exists but belongs to someone else
    CANNOT_ACT = "cannot_act"  # the service may not act as this user (sudo refused)
    SLURM = "slurm"  # Slurm refused or did not answer (the message says which)
    INVALID = "invalid"  # the content is not what was expected (a config, an index)


class OwnerAccessError(SlurmError):
    """An operation as the run's owner failed. A SlurmError, so the reconciler treats a
    refusal to act as the owner like an sbatch refusal: the run fails with the reason."""

    def __init__(self, failure: OwnerFailure, message: str) -> None:
        super().__init__(message)
        self.failure = failure
