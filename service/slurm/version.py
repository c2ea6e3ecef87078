"""The Slurm this process talks to: its version, read once, and the features runyard uses
on it (contract/slurm_features.py). The adapters (commands.py, accounting.py, topology.py)
ask `current()` which form of a command to run and how to read it.

Read once per process and cluster: `scontrol --version` is a process start (~10 ms) and the
reconciler would otherwise pay it on every call. The key is the scontrol binary the PATH
finds, so a process that points at another Slurm (another prefix first on PATH) reads that
Slurm's version.
"""

from __future__ import annotations

import functools
import shutil
import subprocess
from dataclasses import dataclass

from contract.slurm_features import SlurmFeature, SlurmVersion, available_in, features_of


class UnknownSlurmVersion(RuntimeError):
    """`scontrol --version` did not answer with a version."""


@dataclass(frozen=True)
class SlurmRelease:
    """A Slurm version and what runyard uses on it."""

    version: SlurmVersion
    features: frozenset[SlurmFeature]  # what runyard uses on it
    available: frozenset[SlurmFeature]  # what it has, used or not

    @classmethod
    def of(cls, version: SlurmVersion) -> SlurmRelease:
        return cls(version, features_of(version), available_in(version))

    def has(self, feature: SlurmFeature) -> bool:
        return feature in self.features


def current(env: dict[str, str]) -> SlurmRelease:
    """The release of the Slurm that `env` (PATH, SLURM_CONF) reaches, read once."""
    return _read(shutil.which("scontrol", path=env.get("PATH")) or "scontrol")


@functools.cache
def _read(scontrol: str) -> SlurmRelease:
    # The client's version, not slurmctld's: it decides which options exist and how output
    # is printed, and Slurm refuses a client more than two releases from its controller.
    try:
        out = subprocess.run([scontrol, "--version"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise UnknownSlurmVersion(f"{scontrol} --version: {exc}") from exc
    version = SlurmVersion.parse(out.stdout)
    if version is None:
        raise UnknownSlurmVersion(f"{scontrol} --version printed {out.stdout.strip()!r}")
    return SlurmRelease.of(version)


def forget() -> None:
    """Read the version again at the next call (a Slurm upgraded under a running service,
    or a test that replays another version's output)."""
    _read.cache_clear()
