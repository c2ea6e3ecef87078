"""What a cluster says of itself: its ClusterName and the version of its slurmctld.

`scontrol show config` asks the controller, so it answers only while the controller is
up: how the cluster list tells a reachable cluster from one that is not. The name of the
site's one cluster is read from its slurm.conf first, a file, so that a service started
while slurmctld is down still names its cluster as it did before (its rows carry it).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from service.slurm.commands import SlurmError, parse_key_values, run_slurm
from service.slurm.target import SlurmTarget

# Slurm's compiled-in default when neither the settings nor the environment name one.
DEFAULT_SLURM_CONF = Path("/etc/slurm/slurm.conf")
# The name of the site's one cluster when nothing names it: not a Slurm name, so that a
# site that sees it in `runyard cluster list` knows its ClusterName was never read.
FALLBACK_CLUSTER_NAME = "default"


@dataclass(frozen=True)
class ClusterInfo:
    """A controller's answer to `scontrol show config`."""

    name: str  # ClusterName, lower-cased as Slurm keeps it
    version: str  # SLURM_VERSION of slurmctld, e.g. 23.11.4


def parse_config(out: str) -> ClusterInfo:
    """ClusterName and SLURM_VERSION from `scontrol show config` (`Key = Value` lines)."""
    fields: dict[str, str] = {}
    for line in out.splitlines():
        key, sep, value = line.partition("=")
        if sep:
            fields[key.strip()] = value.strip()
    return ClusterInfo(fields.get("ClusterName", "").lower(), fields.get("SLURM_VERSION", ""))


def show_config(target: SlurmTarget) -> ClusterInfo:
    """The controller's own name and version; SlurmError when it does not answer."""
    return parse_config(run_slurm(target, ["scontrol", "show", "config"]))


def cluster_name_in(slurm_conf: Path) -> str | None:
    """The ClusterName a slurm.conf sets (Slurm lower-cases it), or None."""
    try:
        text = slurm_conf.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        fields = parse_key_values(line.partition("#")[0])
        for key, value in fields.items():
            if key.lower() == "clustername" and value:
                return value.lower()
    return None


def local_cluster_name(slurm_conf: Path | None) -> str:
    """The ClusterName of the Slurm the service's environment reaches: its slurm.conf's
    (`slurm_conf`, else $SLURM_CONF, else Slurm's default path), else the controller's
    (`scontrol show config`, for configless sites), else FALLBACK_CLUSTER_NAME."""
    conf = slurm_conf or Path(os.environ.get("SLURM_CONF") or DEFAULT_SLURM_CONF)
    name = cluster_name_in(conf)
    if name:
        return name
    try:
        name = show_config(SlurmTarget("", slurm_conf)).name
    except SlurmError:
        name = ""
    return name or FALLBACK_CLUSTER_NAME
