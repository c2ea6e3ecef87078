"""Experiment trackers: where runs' metrics are exported (MLflow, W&B, TensorBoard)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field

from service.config_areas.base import AreaSettings


class TrackingSettings(AreaSettings):
    """Experiment trackers.

    Where a run's `tracking:` section is exported (service/tracking/): the site's MLflow
    server, W&B's mode and folder, TensorBoard's root, and how often the exporters look
    and retry."""

    mlflow_tracking_uri: str | None = Field(
        default=None,
        description="The site's MLflow tracking server (http://host:5000); None: runs may not "
        "ask for mlflow. `runyard dev up --with mlflow` starts one on Postgres.",
    )
    mlflow_request_timeout_s: float = Field(
        default=10.0,
        gt=0,
        description="One MLflow request's timeout; a server that does not answer in time is "
        "retried later (the export waits, training never does).",
    )
    wandb_mode: Literal["offline", "online"] = Field(
        default="offline",
        description="offline: W&B runs are written under wandb_dir, for `wandb sync` (no "
        "network from the service); online: sent to W&B (needs WANDB_API_KEY).",
    )
    wandb_dir: Path | None = Field(
        default=None,
        description="Where W&B run folders are written, <dir>/<team>/wandb/ (default: the "
        "service's own folder, state_dir/service/wandb; set a shared folder the teams can "
        "read, so they can `wandb sync` them).",
    )
    wandb_entity: str | None = Field(
        default=None, description="The W&B entity runs log to when their spec names none."
    )
    tensorboard_root: Path | None = Field(
        default=None,
        description="Root of TensorBoard log folders, <root>/<team>/<run id>-<name> (default: "
        "the service's own folder, state_dir/service/tensorboard; set a shared folder the "
        "teams can read, and point TensorBoard at it).",
    )
    tracking_export_interval_s: float = Field(
        default=2.0, gt=0, description="How often the exporters look for new steps and events."
    )
    tracking_retry_max_s: float = Field(
        default=60.0,
        gt=0,
        description="Longest wait between tries of a tracker that fails (doubling from "
        "tracking_export_interval_s).",
    )
