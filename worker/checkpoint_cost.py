"""What an asynchronous save costs training: its blocking time and its overlapped steps' excess.

A save in the background still costs training in two ways. It blocks: the call that starts
it, the wait for its copy before the next update, the wait for it to finish before the
next save or at the end of the attempt. And it slows the steps that run beside it: its
threads compete with training for the GIL, CPU cores and memory bandwidth, its copy for
the GPU's memory. Only the first is visible as waiting; the second shows only as slower
steps (measured by the issue's filer on one H200: a save reported 0.136 s blocked, and
the steps beside it were 5.3 s slower in all). A save's cost is both:

    cost = blocking + (time of the steps beside it - as many steps at the pace without one)

SaveCostMeter measures that from the loop's own timing, with no sync of its own: it is
told once per step (AsyncCheckpointer.poll) and of every block. The pace without a save is
the mean time of the last BASELINE_STEPS steps that ran with none in flight, their own
blocks left out. On a GPU the host may run up to a step or two ahead of the device when
the save completes, so the steps beside it are counted up to that point of the host's:
an underestimate of at most that run-ahead's share of the write.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

BASELINE_STEPS = 50  # steps without a save whose mean time is the pace to compare with


@dataclass(frozen=True)
class SaveCost:
    """One save's cost to training, in seconds."""

    blocking_s: float  # training waited for the save
    excess_s: float  # the steps beside it took this much longer than at the usual pace
    num_steps_beside: int  # steps that ran while it was in flight

    @property
    def stall_s(self) -> float:
        """What the save cost training in all: its checkpoint badput. Noise can make the
        excess of a well-hidden save slightly negative; it never lowers the cost below
        what training demonstrably waited."""
        return self.blocking_s + max(self.excess_s, 0.0)


class SaveCostMeter:
    """The cost of each save, one in flight at a time (see the module's docstring)."""

    def __init__(self) -> None:
        self._recent: deque[float] = deque(maxlen=BASELINE_STEPS)  # steps without a save
        self._last_step_end: float | None = None
        self._blocked_since_step = 0.0  # blocks since the last step ended (left out of it)
        # The save in flight: when it started (its first block ended), its blocks so far,
        # the steps beside it and their time, its own blocks left out.
        self._in_flight = False
        self._blocking_s = 0.0
        self._steps_beside = 0
        self._beside_s = 0.0

    @property
    def step_s(self) -> float | None:
        """The usual pace: mean time of the recent steps without a save (None before any)."""
        return sum(self._recent) / len(self._recent) if self._recent else None

    def blocked(self, seconds: float) -> None:
        """Training waited `seconds` for the save in flight (or for starting one)."""
        self._blocked_since_step += seconds
        self._blocking_s += seconds

    def started(self) -> None:
        """A save started (its start's block already counted through blocked())."""
        self._in_flight = True

    def step_ended(self) -> None:
        """One training step ended (called once per step, after it)."""
        now = time.perf_counter()
        if self._last_step_end is not None:
            own = max(now - self._last_step_end - self._blocked_since_step, 0.0)
            if self._in_flight:
                self._steps_beside += 1
                self._beside_s += own
            else:
                self._recent.append(own)
        self._last_step_end = now
        self._blocked_since_step = 0.0

    def skip(self) -> None:
        """Forget the time since the last step: what ran meanwhile was not training (a
        bench's synchronous save between two steps)."""
        self._last_step_end = time.perf_counter()
        self._blocked_since_step = 0.0

    def finished(self) -> SaveCost:
        """The save in flight is done: its cost; the meter is ready for the next one."""
        pace = self.step_s
        excess = self._beside_s - self._steps_beside * pace if pace is not None else 0.0
        cost = SaveCost(self._blocking_s, excess, self._steps_beside)
        self._in_flight = False
        self._blocking_s = self._beside_s = 0.0
        self._steps_beside = 0
        return cost
