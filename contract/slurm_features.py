"""Which Slurm features runyard uses on which Slurm version: one table for the service's
adapters (service/slurm) and `runyard doctor`, which must say the same thing.

It lives in the contract because the doctor is part of the CLI, which may not import the
service; it imports nothing of runyard's. Each feature carries the release that brought it,
from the NEWS file of Slurm 24.11.5's source (Debian 13's tarball); a feature a release has
may still not be taken (NOT_TAKEN: measured, not assumed). 22.05 has a `squeue --json` of
its own, but it ignores `-j` and `-r` and prints raw wait statuses, so it does not count.
Tested versions are 22.05 (Debian 12) and 24.11 (Debian 13); between them the table is read
from NEWS, not tested.
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


# The first release that has each feature (see SlurmFeature for the sources).
FIRST_RELEASE: dict[SlurmFeature, SlurmVersion] = {
    SlurmFeature.SCONTROL_JSON: SlurmVersion(24, 5, 1),
    SlurmFeature.SQUEUE_JSON: SlurmVersion(24, 5, 1),
    SlurmFeature.SACCT_JSON: SlurmVersion(24, 5, 1),
    SlurmFeature.TOPOLOGY_BLOCK: SlurmVersion(24, 5, 0),
    SlurmFeature.SEGMENT: SlurmVersion(24, 5, 0),
    SlurmFeature.NODE_STATE_BLOCKED: SlurmVersion(24, 5, 0),
}
# Present but not taken. The JSON forms are complete from 24.05.1 (runyard's JSON readers
# give the same answers as the text ones on 24.11.5's recorded output), but slower: 1.4x
# (show reservation) to 8.5-10x (show job) the text forms' time on 24.11.5 with 200 to 400
# jobs known, the command itself the cost (2 MB of JSON against 240 KB of text for show
# job), measured by bench/slurm_output_forms.py on the dev cluster (two runs). The
# reconciler runs them every tick, so runyard reads text, and takes a JSON form again the
# day the bench finds it no slower.
NOT_TAKEN: frozenset[SlurmFeature] = frozenset(
    {SlurmFeature.SCONTROL_JSON, SlurmFeature.SQUEUE_JSON, SlurmFeature.SACCT_JSON}
)
# The Slurm versions runyard's tests run on, and the command that runs them (docs/install.md).
TESTED_RELEASES = ("22.05", "24.11")


def available_in(version: SlurmVersion) -> frozenset[SlurmFeature]:
    """Every feature `version` has."""
    return frozenset(f for f, first in FIRST_RELEASE.items() if version >= first)


def features_of(version: SlurmVersion) -> frozenset[SlurmFeature]:
    """Every feature runyard uses on `version`."""
    return available_in(version) - NOT_TAKEN
