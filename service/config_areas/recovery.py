"""Recovering runs: restarts, stops, hangs and the checkpoint interval."""

from __future__ import annotations

from pydantic import Field

from service.config_areas.base import AreaSettings


class RecoverySettings(AreaSettings):
    """Runs: restarts, stops, hangs and checkpoints.

    How often a failed run is submitted again, how long ranks asked to stop have to save a
    checkpoint, when a run without steps is hung, and the window of failures that sets a
    running run's checkpoint interval. When a node is drained: the node health area."""

    default_max_restarts: int = Field(
        default=3,
        ge=0,
        description="Automatic re-submissions of a failed run, unless the spec says.",
    )
    stop_grace_s: float = Field(
        default=180.0,
        gt=0,
        description="How long ranks asked to stop (preemption, a segment's end, a slow node, "
        "a cancel) have to save a checkpoint and exit before their jobs are scancelled.",
    )
    segment_stop_margin_s: float = Field(
        default=180.0,
        gt=0,
        description="Stop a time-limited segment this long before its Slurm limit, so it "
        "checkpoints and exits cleanly.",
    )
    hang_factor: float = Field(
        default=20.0, gt=1, description="A run is hung after this many median step times..."
    )
    hang_min_s: float = Field(
        default=30.0, gt=0, description="...and never before this many seconds without a step."
    )
    live_checkpoint_window_h: float = Field(
        default=168.0,
        gt=0,
        description="The window over which the cluster's observed failures (incidents per "
        "node-hour) set each running run's checkpoint interval (service/runs/"
        "live_interval.py); a week holds tens of failures at 1,000 nodes.",
    )
