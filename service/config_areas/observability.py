"""Observability: the service's log lines, and when a run's goodput is judged low."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from service.config_areas.base import AreaSettings


class ObservabilitySettings(AreaSettings):
    """Logs and alerts.

    What the service's log lines look like to a log shipper, and from when a run's goodput
    counts as low (the goodput.low event, the RunyardGoodputLow alert)."""

    log_format: Literal["json", "text"] = Field(
        default="json",
        description="Service log lines: one JSON object each (with run, attempt and node ids) "
        "for log shippers, or plain text.",
    )
    goodput_low_after_s: float = Field(
        default=3600.0,
        ge=0,
        description="goodput.low is judged only after a run held its nodes this long "
        "(start-up counts as lost time), as the RunyardGoodputLow alert does.",
    )
