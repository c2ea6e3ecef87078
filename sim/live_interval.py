"""The service's live checkpoint interval on the simulated cluster.

The service re-derives a running run's interval from the failures the cluster had over a
window (service/runs/live_interval.py). Here the same functions are fed with what the
simulation's cluster sees: each failure as it happens, the cluster's node-hours in the
window, the run's nodes, its checkpoint stall and step time. As in the service, a change
under `live_interval.MIN_CHANGE` of the current interval is not made.
"""

from __future__ import annotations

from collections import deque

from service.config import Settings
from service.runs import live_interval


class LiveInterval:
    """The interval a run would be told while it trains through the simulated failures."""

    def __init__(
        self,
        settings: Settings,
        *,
        cluster_nodes: int,
        run_nodes: int,
        gpus_per_node: int,
        stall_s: float,
        step_s: float,
        start_interval_s: float,
    ) -> None:
        self.window_h = settings.live_checkpoint_window_h
        self.cluster_nodes, self.run_nodes = cluster_nodes, run_nodes
        self.prior = live_interval.prior_per_node_hour(gpus_per_node)
        self.stall_s, self.step_s = stall_s, step_s
        self.steps = max(1, round(start_interval_s / step_s))
        self.failures: deque[float] = deque()  # times of the failures inside the window
        self.changes = 0

    def observe(self, t: float) -> None:
        """A failure the service counted (an incident) at `t`."""
        self.failures.append(t)

    def update(self, t: float) -> float | None:
        """The new interval in seconds if the service would change it at `t`, else None."""
        window_s = self.window_h * 3600
        while self.failures and self.failures[0] < t - window_s:
            self.failures.popleft()
        node_hours = self.cluster_nodes * min(window_s, t) / 3600
        rate = live_interval.failure_rate(
            {"failure": len(self.failures)}, node_hours, self.window_h, self.prior
        )
        new = live_interval.derive(rate.per_node_hour, self.run_nodes, self.stall_s, self.step_s)
        if abs(new.steps - self.steps) < live_interval.MIN_CHANGE * self.steps:
            return None
        self.steps, self.changes = new.steps, self.changes + 1
        return new.interval_s
