"""Which Slurm features runyard uses on which Slurm version: one table for the service's
adapters (service/slurm) and `runyard doctor`, which must say the same thing.

It lives in the contract because the doctor is part of the CLI, which may not import the
service; it imports nothing of runyard's. Each feature carries the release that brought it,
from the NEWS file of Slurm 24.11.5's source (Debian 13's tarball), and whether runyard
uses it there: some exist earlier than runyard takes them (22.05 has `squeue --json`, but
it ignores `-j` and dumps every job, see SQUEUE_JSON). Tested versions are 22.05 (Debian
12) and 24.11 (Debian 13); between them the table is read from NEWS, not tested.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum


@dataclass(frozen=True, order=True)
class SlurmVersion:
    major: int
    minor: int
    micro: int = 0

    @classmethod
    def parse(cls, text: str) -> SlurmVersion | None:
        """'slurm-wlm 22.05.8', 'slurm 24.11.5' or '"release": "24.11.5"' -> the version."""
        match = re.search(r"(\d+)\.(\d+)(?:\.(\d+))?", text)
        if match is None:
            return None
        return cls(int(match.group(1)), int(match.group(2)), int(match.group(3) or 0))

    def __str__(self) -> str:
        return f"{self.major}.{self.minor:02d}.{self.micro}"

    @property
    def release(self) -> str:
        """'24.11': the release series, as sites and Slurm's docs name it."""
        return f"{self.major}.{self.minor:02d}"


class SlurmFeature(StrEnum):
    """A Slurm capability whose presence changes what runyard runs."""

    # Job and node queries as JSON (data_parser plugins): `scontrol --json show
    # job|node|reservation`; 22.05's scontrol has no --json at all.
    SCONTROL_JSON = "scontrol --json"
    # `squeue --json` that honours -j/-t/-n (NEWS 24.05.1: "Fix filtering arguments being
    # ignored when using squeue --json"); before, it listed every job slurmctld knew.
    SQUEUE_JSON = "squeue --json"
    # `sacct --json` in the data_parser format (the same job records as scontrol's);
    # 22.05 prints its older openapi/dbv0.0.38 format, read as text instead.
    SACCT_JSON = "sacct --json"
    # TopologyPlugin=topology/block: blocks of nodes (an NVL72 rack, a leaf switch) that
    # Slurm pairs into larger aligned blocks (NEWS 23.11; BlockSizes replaced BlockLevels in
    # 24.05).
    TOPOLOGY_BLOCK = "topology/block"
    # `sbatch --segment=N`: each N nodes of a job inside one base block, segments in any
    # blocks (NEWS 24.05.0rc1: "Add --segment to job allocation").
    SEGMENT = "--segment"
    # Node state BLOCKED (a node held by another job's --exclusive=topo block; NEWS
    # 24.05.0rc1): not free, though idle.
    NODE_STATE_BLOCKED = "node state BLOCKED"


# The first release in which runyard uses each feature (see SlurmFeature for the sources).
# SCONTROL_JSON and SACCT_JSON exist from 23.02 (data_parser/v0.0.39); runyard takes them
# from 24.05, the first release whose squeue --json filters too, so that one version reads
# every job query the same way.
FIRST_RELEASE: dict[SlurmFeature, SlurmVersion] = {
    SlurmFeature.SCONTROL_JSON: SlurmVersion(24, 5, 1),
    SlurmFeature.SQUEUE_JSON: SlurmVersion(24, 5, 1),
    SlurmFeature.SACCT_JSON: SlurmVersion(24, 5, 1),
    SlurmFeature.TOPOLOGY_BLOCK: SlurmVersion(24, 5, 0),
    SlurmFeature.SEGMENT: SlurmVersion(24, 5, 0),
    SlurmFeature.NODE_STATE_BLOCKED: SlurmVersion(24, 5, 0),
}
# The Slurm versions runyard's tests run on, and the command that runs them (docs/install.md).
TESTED_RELEASES = ("22.05", "24.11")


def features_of(version: SlurmVersion) -> frozenset[SlurmFeature]:
    """Every feature runyard uses on `version`."""
    return frozenset(f for f, first in FIRST_RELEASE.items() if version >= first)
