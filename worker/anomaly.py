"""Loss spikes and non-finite values (issue 15): the verdict on each reported step.

Every rank judges the same figures (a report's losses are all-reduced and the gradient norm
is global), so every rank reaches the same verdict at the same step without a collective.

Detection latency: the loop reads the losses back only at a report (worker/step.py
ReportWindow: one host sync per window, never one per step), so an anomaly at step k is
found at the end of k's window: at most MAX_STEPS_PER_REPORT steps, about
report_interval_s, after it happened. It is reported with its own step k. Checkpoint steps
always close a window before they save, so no checkpoint is ever written after an anomaly:
the newest committed checkpoint is from before it.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass

from contract.run_config import SpikeRule
from worker.step import StepFigures


@dataclass(frozen=True)
class Anomaly:
    step: int
    kind: str  # "non_finite" or "spike"
    figure: str  # "loss" or "grad_norm"
    value: float
    threshold: float | None  # the spike threshold it crossed; None for non-finite

    def describe(self) -> str:
        if self.kind == "non_finite":
            return f"non-finite {self.figure} ({self.value}) at step {self.step}"
        return (
            f"{self.figure} spike at step {self.step}: {self.value:.4g} > "
            f"threshold {self.threshold:.4g}"
        )


class TrainingAnomalyError(RuntimeError):
    """Raised by every rank after an anomaly: the attempt ends, the service rolls back."""

    def __init__(self, anomaly: Anomaly) -> None:
        super().__init__(anomaly.describe())
        self.anomaly = anomaly


class SpikeDetector:
    """The recent finite losses and gradient norms, and the rule they are judged by."""

    def __init__(self, rule: SpikeRule, warmup_steps: int) -> None:
        self.rule, self.warmup_steps = rule, warmup_steps
        self._history: dict[str, deque[float]] = {
            name: deque(maxlen=rule.window) for name in ("loss", "grad_norm")
        }

    def judge(self, figures: StepFigures) -> Anomaly | None:
        """The first anomaly in `figures` (loss before gradient norm), then remember it."""
        values = {"loss": figures.loss, "grad_norm": figures.grad_norm}
        for name, value in values.items():
            if not math.isfinite(value):
                return Anomaly(figures.step, "non_finite", name, value, None)
        if self.rule.enabled and figures.step > self.warmup_steps:
            for name in self.rule.figures:
                value = values[name]
                threshold = self.threshold(name)
                if threshold is not None and value > threshold:
                    return Anomaly(figures.step, "spike", name, value, threshold)
        for name, value in values.items():
            self._history[name].append(value)
        return None

    def threshold(self, name: str) -> float | None:
        """max(mean + z * std, ratio * mean) of the recent values; None: too few yet."""
        history = self._history[name]
        if len(history) < self.rule.min_history:
            return None
        mean = statistics.fmean(history)
        std = statistics.pstdev(history, mean)
        return max(mean + self.rule.z * std, self.rule.ratio * mean)
