"""Slow nodes (issue 15): each rank's update time, measured where no rank waits for another.

Synchronous training moves in lock-step: every collective waits for the slowest rank, so
every rank's step takes the same wall time and a straggler cannot be seen in it. What
differs is the work a rank does alone. The optimizer update is such work in every layout
runyard trains (FSDP2 and `replicate` update the local shards; no collective runs in
AdamW): a throttled or failing GPU takes longer over it than its peers, and none of the
others' waiting is in it. So each rank times its update (CUDA events on a GPU: device time,
read back only at a report, when the host waits for the device anyway; the host clock on a
CPU), and the report's one all-reduce carries every rank's mean of the window, one slot per
rank (worker/step.py ReportWindow.close: no extra collective). Rank 0 turns them into one
figure per node, the slowest of its ranks, and sends that with its progress report; the
service applies the rule (service/nodes/stragglers.py).
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist


class UpdateTimer:
    """This rank's update times since the last report. start()/stop() never sync the host."""

    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._host_s: list[float] = []
        self._events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self._started = 0.0
        self._start_event: torch.cuda.Event | None = None

    def start(self) -> None:
        if self.cuda:
            self._start_event = torch.cuda.Event(enable_timing=True)
            self._start_event.record()
        else:
            self._started = time.perf_counter()

    def stop(self) -> None:
        if self.cuda:
            assert self._start_event is not None
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._events.append((self._start_event, end))
        else:
            self._host_s.append(time.perf_counter() - self._started)

    def take_mean_s(self) -> float:
        """The mean update time since the last call (0.0 if none), and start a new window.
        On a GPU this waits for the last update's end event: the report that calls it reads
        the window back right after, so the host waits for the device there anyway."""
        if self.cuda:
            if self._events:
                self._events[-1][1].synchronize()
            times = [start.elapsed_time(end) / 1000.0 for start, end in self._events]
            self._events = []
        else:
            times, self._host_s = self._host_s, []
        return sum(times) / len(times) if times else 0.0


def rank_nodes(node: str) -> list[str]:
    """Every rank's node name, by rank: one all_gather_object when the loop starts."""
    nodes: list[str] = [""] * dist.get_world_size()
    dist.all_gather_object(nodes, node)  # sync: once per attempt, before the first step
    return nodes


def node_update_s(rank_update_s: list[float], nodes: list[str]) -> dict[str, float]:
    """The slowest rank's update time on each node (pure): a node is as slow as its
    slowest GPU, since every collective waits for it."""
    slowest: dict[str, float] = {}
    for seconds, node in zip(rank_update_s, nodes, strict=True):
        slowest[node] = max(slowest.get(node, 0.0), seconds)
    return slowest
