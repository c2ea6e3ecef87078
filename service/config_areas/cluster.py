"""Slurm and the cluster."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field

from service.config_areas.base import AreaSettings


class ClusterSettings(AreaSettings):
    """Slurm and the cluster.

    Which Slurm the service submits to and how its jobs are named and prioritised there,
    the Python the ranks run with, and what the nodes hold (for the planner's
    admission)."""

    slurm_conf: Path | None = Field(
        default=None, description="SLURM_CONF for sbatch/squeue/scontrol (None: Slurm's default)."
    )
    cluster_name: str | None = Field(
        default=None,
        pattern=r"^[a-z0-9][a-z0-9_.-]{0,63}$",
        description="Slurm's ClusterName of the site's one cluster, when no clusters_file "
        "lists them (None: the ClusterName of its slurm.conf, else `scontrol show config`'s, "
        "else `default`).",
    )
    partition: str = Field(default="train", description="Slurm partition runs are submitted to.")
    job_prefix: str | None = Field(
        default=None,
        description="Prefix of Slurm job names (default runyard-<database>), so two services "
        "sharing one cluster never adopt each other's jobs.",
    )
    qos_by_priority: dict[str, str] = Field(
        default_factory=dict,
        description="Slurm QoS per runyard priority class, where the site has them (JSON: "
        '{"prod": "high", "scavenger": "low"}); a class not named gets the account\'s default.',
    )
    worker_python: str | None = Field(
        default=None, description="Python interpreter on compute nodes (default: the service's)."
    )
    accelerator: str = Field(
        default="gpu",
        pattern="^(gpu|cpu)$",
        description="What the workers train on: gpu, or cpu (the dev cluster; no fp8).",
    )
    hardware: str = Field(
        default="h100-sxm", description="GPU type of the cluster, for the planner's admission."
    )
    network: str = Field(default="ib", description="ib or efa, for the planner's admission.")
    failover_after_s: float | None = Field(
        default=None,
        gt=0,
        description="How long a run waits for a cluster that cannot run it (controller "
        "silent, or too few healthy nodes with the spares gone) before it moves to another "
        "(None: the time its checkpoint copy takes, at least Slurm's SlurmctldTimeout "
        "default of 120 s; service/clusters/failover.py).",
    )
