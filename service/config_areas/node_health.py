"""Node health: when a node is drained (signals, heartbeats, SDC, slow nodes), and back."""

from __future__ import annotations

from enum import StrEnum
from pathlib import Path

from pydantic import Field

from service.config_areas.base import AreaSettings


class SlowNodePolicy(StrEnum):
    """What the service does with a node flagged SLOW (service/nodes/stragglers.py)."""

    FLAG = "flag"  # show it (node show, /metrics, the node's history); the run stays
    # Also move the run off it: checkpoint at the next report, drain the node, a spare
    # takes its place (only when a spare is free: waiting for one would cost more).
    MOVE = "move"


class NodeHealthSettings(AreaSettings):
    """Node health: drains, SDC and slow nodes.

    When a node is drained and its run moved to a spare: the signals its agent reports
    (the classification table), its heartbeats, and what a run's workers report of it (an
    SDC mismatch, a slow node), which the service trusts only so far; and when a node
    drained for silence returns by itself."""

    classification_file: Path | None = Field(
        default=None,
        description='JSON {"xid:94": "DRAIN_AND_MOVE", ...} overriding rows of the '
        "classification table (service/recovery/classification.py).",
    )
    app_errors_before_drain: int = Field(
        default=3,
        ge=1,
        description="Application-class Xids (13/31/43) on a node before it is drained.",
    )
    heartbeat_suspect_s: float = Field(
        default=10.0, gt=0, description="Silence after which a node with an agent is SUSPECT."
    )
    heartbeat_dead_s: float = Field(
        default=20.0, gt=0, description="Silence after which a node is presumed dead and drained."
    )
    heartbeat_return_s: float = Field(
        default=600.0,
        ge=0,
        description="A node drained only because its agent fell silent returns to service by "
        "itself once the agent has heartbeated this long with no gap over "
        "heartbeat_suspect_s, unless something else holds it out (an Xid, NVML or other "
        "agent-reported fault, another incident, an admin drain, a Slurm drain that is not "
        "runyard's); 0: never, such a node waits for `runyard node resume`. 600 s (30x "
        "heartbeat_dead_s): an agent restart costs the node ten minutes rather than an "
        "on-call's visit, while an agent that keeps dying (a crash loop, a host short of "
        "memory, a flapping link) is not put back under a run every few minutes.",
    )
    report_drains_per_run: int = Field(
        default=2,
        ge=0,
        description="A worker's report that names a node (an SDC mismatch, a slow node) is a "
        "claim by the run's own code: at most this many such drains per run within "
        "report_drain_window_s; past it the service opens an incident for the on-call and "
        "drains nothing. Two: a real SDC or slow GPU is rare (1.4% of Llama 3's "
        "interruptions), so a second one inside a day already says more about the run than "
        "about the nodes.",
    )
    report_drain_window_s: float = Field(
        default=86400.0, gt=0, description="The window report_drains_per_run counts over."
    )
    slow_node_policy: SlowNodePolicy = Field(
        default=SlowNodePolicy.MOVE,
        description="flag: a persistently slow node is shown (node show, /metrics "
        "runyard_node_slow) and left in its run; move: also moved off at once with a "
        "checkpoint, drained, and replaced by a spare. move by default: synchronous training "
        "runs at its slowest rank, so a node 1.25x slow costs every GPU of the run 20% for "
        "as long as it stays, while the move costs one restart and no steps.",
    )
    slow_node_margin: float = Field(
        default=1.25,
        gt=1.0,
        description="A node is slow in a report when its slowest rank's update time is above "
        "this x the median of the other nodes' (MegaScale reports stragglers at 1.1-1.5x).",
    )
    slow_node_min_excess_s: float | None = Field(
        default=None,
        ge=0,
        description="...and at least this many seconds above that median, so jitter is not a "
        "straggler. Default by accelerator: 0.001 on GPUs (an update takes about a "
        "millisecond there, timed on the device); 0.1 on cpu, the dev cluster, where ranks "
        "sharing two cores jitter by tens of ms.",
    )
    slow_node_reports: int = Field(
        default=5,
        ge=1,
        description="Consecutive slow reports (each a mean over ~report_interval_s of steps) "
        "before a node is flagged SLOW; one report within the margin clears the count.",
    )
