"""The reconciler: whether this process runs the loop, and how often."""

from __future__ import annotations

from pydantic import Field

from service.config_areas.base import AreaSettings


class ReconcilerSettings(AreaSettings):
    """The reconciler.

    The background loop that compares Postgres with Slurm and acts on the difference:
    whether this process runs it, and how often it ticks."""

    run_reconciler: bool = Field(
        default=True, description="Run the background reconcile loop inside the API process."
    )
    reconcile_interval_s: float = Field(
        default=1.0, gt=0, description="How often the reconciler compares Postgres with Slurm."
    )
