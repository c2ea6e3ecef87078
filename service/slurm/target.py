"""Which cluster a Slurm command goes to, and how: the one place that turns a configured
cluster (service/config_areas/clusters.py) into a command line and an environment.

Every command the service runs (squeue, scontrol, scancel, sacct, srun, sbatch through
submitit) takes a `SlurmTarget`, so no command can reach a cluster by accident of the
process's environment. Slurm's multi-cluster operation puts `-M <name>` on the command
(the local SLURM_CONF's slurmdbd tells the client where that controller listens); a cluster
with a slurm.conf of its own is reached with SLURM_CONF in the command's environment.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from service.config_areas.clusters import ClusterConfig, ClusterReach

# What Slurm's clients print before a cluster's answer when given -M (squeue, sinfo):
# "CLUSTER: <name>". Dropped so that every parser reads the answer as without -M.
CLUSTER_HEADER = "CLUSTER: "


@dataclass(frozen=True)
class SlurmTarget:
    """One cluster as its commands reach it."""

    cluster: str  # Slurm's ClusterName; "" where the environment's Slurm is meant as such
    slurm_conf: Path | None = None  # SLURM_CONF for the command (None: the environment's)
    multicluster: bool = False  # `-M cluster` on every command

    @classmethod
    def of(cls, config: ClusterConfig, site_slurm_conf: Path | None) -> SlurmTarget:
        """How `config` is reached from a service whose own Slurm is `site_slurm_conf`:
        multi-cluster goes through the site's slurm.conf (its slurmdbd knows the others)."""
        if config.reach is ClusterReach.SLURM_CONF:
            return cls(config.name, config.slurm_conf)
        multicluster = config.reach is ClusterReach.MULTICLUSTER
        return cls(config.name, site_slurm_conf, multicluster)

    def argv(self, argv: list[str]) -> list[str]:
        """`argv` with `-M <cluster>` after the command's name where multi-cluster."""
        if not self.multicluster:
            return argv
        return [argv[0], "-M", self.cluster, *argv[1:]]

    def env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """The command's environment: `base` (the process's) with SLURM_CONF set."""
        env = dict(os.environ if base is None else base)
        if self.slurm_conf is not None:
            env["SLURM_CONF"] = str(self.slurm_conf)
        return env

    def answer(self, out: str) -> str:
        """A command's stdout without the `CLUSTER: <name>` line -M adds."""
        if not self.multicluster or CLUSTER_HEADER not in out:
            return out
        lines = out.splitlines(keepends=True)
        return "".join(line for line in lines if not line.startswith(CLUSTER_HEADER))

    @property
    def sbatch_clusters(self) -> str | None:
        """What sbatch's --clusters gets (submitit's additional parameters), or None."""
        return self.cluster if self.multicluster else None
