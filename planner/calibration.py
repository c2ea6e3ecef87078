"""Per-cluster corrections of the planner, fitted from the runs the cluster itself measured.

The planner's figures come from datasheets and published measurements. A site differs
from them (power caps, its network, its filesystem, its PyTorch): its own runs say by how
much. Each finished or running run leaves what the planner predicted (the step split into
its compute and communication parts, `step_time.step_terms_s`; the checkpoint's write
time) beside what the service measured (steady-state step time, save stalls, restarts);
from enough of them this module fits one correction per term:

- compute and communication: factors on the step-time model's two kinds of terms
  (`step_time.StepScale`), fitted together so that the layouts' ranking changes where the
  site differs (a slow network favours layouts that communicate less). They can only be
  told apart when the runs mix them differently: with fewer than MIN_RUNS_PER_TERM runs, or
  communication shares spread over less than MIN_SHARE_SPREAD, one factor serves both;
- checkpoint: a factor on the planner's checkpoint write time, from measured save stalls;
- start-up: the measured time from an interruption to training again, replacing the
  assumed restart time.

Every fit is robust: it minimises the summed |log error| (a median, for one factor), so
one odd run (a node throttling, a run sharing the network) moves it little. Below MIN_RUNS
runs with a measurement, a term keeps the published figures. These minimums are policy,
not physics: three runs are the fewest whose median is not one run's own figure.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace

from .reliability import ReliabilityAssumptions
from .schemas import CalibrationApplied
from .step_time import UNSCALED, StepScale

MIN_RUNS = 3  # runs with a measurement before a term is corrected at all
MIN_RUNS_PER_TERM = 6  # runs before compute and communication are fitted apart
MIN_SHARE_SPREAD = 0.15  # ... and the spread of their communication shares that needs
# The fit's search range: a site 10x off the published figures is a misconfiguration to
# fix, not a correction to apply.
FACTOR_MIN, FACTOR_MAX = 0.1, 10.0
_COARSE_STEP, _FINE_STEP = 0.1, 0.005  # of the factors' logarithm


@dataclass(frozen=True, slots=True)
class StepObservation:
    """One run's step: the published-figure model's two parts, and what was measured."""

    compute_s: float
    communication_s: float
    measured_s: float

    @property
    def predicted_s(self) -> float:
        return self.compute_s + self.communication_s

    @property
    def communication_share(self) -> float:
        return self.communication_s / self.predicted_s


@dataclass(frozen=True, slots=True)
class Calibration:
    """The corrections a cluster's history supports, and how much history they rest on."""

    scale: StepScale = UNSCALED
    checkpoint: float = 1.0  # factor on the planner's checkpoint write time
    startup_s: float | None = None  # measured interruption-to-training time, if enough
    num_runs: int = 0  # runs the step factors were fitted from
    per_term: bool = False  # compute and communication fitted apart
    num_checkpoint_runs: int = 0
    num_recoveries: int = 0

    @property
    def applied(self) -> bool:
        return bool(self.num_runs or self.num_checkpoint_runs or self.num_recoveries)

    def describe(self) -> str:
        """One line for people: what was corrected, by how much, from how much history."""
        if not self.applied:
            return f"uncalibrated: fewer than {MIN_RUNS} measured runs on this cluster"
        parts = []
        if self.num_runs:
            if self.per_term:
                parts.append(
                    f"compute x{self.scale.compute:.2f}, communication "
                    f"x{self.scale.communication:.2f} from {self.num_runs} runs"
                )
            else:
                parts.append(f"step x{self.scale.compute:.2f} from {self.num_runs} runs")
        if self.num_checkpoint_runs:
            parts.append(f"checkpoint x{self.checkpoint:.2f} from {self.num_checkpoint_runs} runs")
        if self.startup_s is not None:
            parts.append(f"restart {self.startup_s:.0f} s from {self.num_recoveries} recoveries")
        return "calibrated: " + "; ".join(parts)

    def applied_schema(self, hardware: str | None = None) -> CalibrationApplied:
        """This calibration as plans and the API show it (`hardware`: whose history)."""
        return CalibrationApplied(
            applied=self.applied,
            summary=self.describe(),
            compute=self.scale.compute,
            communication=self.scale.communication,
            checkpoint=self.checkpoint,
            restart_s=self.startup_s,
            num_runs=self.num_runs,
            per_term=self.per_term,
            num_checkpoint_runs=self.num_checkpoint_runs,
            num_recoveries=self.num_recoveries,
            hardware=hardware,
        )

    @classmethod
    def from_schema(cls, shown: CalibrationApplied) -> Calibration:
        """A calibration as the API sent it (`runyard plan` applies the service's)."""
        return cls(
            scale=StepScale(shown.compute, shown.communication),
            checkpoint=shown.checkpoint,
            startup_s=shown.restart_s,
            num_runs=shown.num_runs,
            per_term=shown.per_term,
            num_checkpoint_runs=shown.num_checkpoint_runs,
            num_recoveries=shown.num_recoveries,
        )

    def reliability(self, base: ReliabilityAssumptions | None) -> ReliabilityAssumptions:
        """`base` with the measured checkpoint cost and restart time in place of the
        assumed ones. The write time is fixed cost plus size over storage rate, so both
        parts take the factor."""
        a = base or ReliabilityAssumptions()
        if self.num_checkpoint_runs:
            a = replace(
                a,
                checkpoint_fixed_s=a.checkpoint_fixed_s * self.checkpoint,
                storage_bytes_per_s=a.storage_bytes_per_s / self.checkpoint,
                storage_bytes_per_s_per_node=a.storage_bytes_per_s_per_node / self.checkpoint,
            )
        if self.startup_s is not None:
            a = replace(a, restart_s=self.startup_s)
        return a


def _clamped(factor: float) -> float:
    return min(FACTOR_MAX, max(FACTOR_MIN, factor))


def _median_ratio(pairs: Sequence[tuple[float, float]]) -> float:
    """The factor minimising the summed |log(measured / (factor x predicted))|."""
    return _clamped(math.exp(statistics.median(math.log(m / p) for p, m in pairs)))


def _separable(observations: Sequence[StepObservation]) -> bool:
    """Whether the runs mix compute and communication differently enough to tell them apart."""
    if len(observations) < MIN_RUNS_PER_TERM:
        return False
    shares = [o.communication_share for o in observations]
    return max(shares) - min(shares) >= MIN_SHARE_SPREAD


def _log_loss(observations: Sequence[StepObservation], compute: float, comm: float) -> float:
    return sum(
        abs(math.log(o.measured_s / (compute * o.compute_s + comm * o.communication_s)))
        for o in observations
    )


def _axis(center: float, half_width: float, step: float) -> list[float]:
    """Log-factors from center - half_width to center + half_width, inside the range."""
    lo, hi = math.log(FACTOR_MIN), math.log(FACTOR_MAX)
    count = round(2 * half_width / step)
    points = (center - half_width + i * step for i in range(count + 1))
    return [p for p in points if lo - 1e-9 <= p <= hi + 1e-9]


def fit_step_scale(observations: Sequence[StepObservation]) -> tuple[StepScale, bool]:
    """(factors, fitted apart) minimising the summed |log error| of the step times.

    A coarse grid over the factors' logarithms, then a fine one around its best point;
    among equally good points the one nearest the published figures wins."""
    if not _separable(observations):
        factor = _median_ratio([(o.predicted_s, o.measured_s) for o in observations])
        return StepScale(factor, factor), False

    def cost(point: tuple[float, float]) -> tuple[float, float]:
        loss = _log_loss(observations, math.exp(point[0]), math.exp(point[1]))
        return round(loss, 9), abs(point[0]) + abs(point[1])

    best = (0.0, 0.0)
    for half_width, step in ((math.log(FACTOR_MAX), _COARSE_STEP), (_COARSE_STEP, _FINE_STEP)):
        compute_axis = _axis(best[0], half_width, step)
        comm_axis = _axis(best[1], half_width, step)
        best = min(((c, m) for c in compute_axis for m in comm_axis), key=cost)
    return StepScale(math.exp(best[0]), math.exp(best[1])), True


def calibrate(
    steps: Sequence[StepObservation],
    checkpoints: Sequence[tuple[float, float]] = (),
    restarts_s: Sequence[float] = (),
) -> Calibration:
    """The corrections `steps` (one per run), `checkpoints` ((predicted write s, measured
    stall s), one per run) and `restarts_s` (one per recovery) support; a term with fewer
    than MIN_RUNS measurements keeps the published figures."""
    usable = [o for o in steps if o.measured_s > 0 and o.predicted_s > 0]
    scale, per_term, num_runs = UNSCALED, False, 0
    if len(usable) >= MIN_RUNS:
        scale, per_term = fit_step_scale(usable)
        num_runs = len(usable)
    saves = [(p, m) for p, m in checkpoints if p > 0 and m > 0]
    checkpoint = _median_ratio(saves) if len(saves) >= MIN_RUNS else 1.0
    restarts = [r for r in restarts_s if r > 0]
    startup = statistics.median(restarts) if len(restarts) >= MIN_RUNS else None
    return Calibration(
        scale=scale,
        checkpoint=checkpoint,
        startup_s=startup,
        num_runs=num_runs,
        per_term=per_term,
        num_checkpoint_runs=len(saves) if len(saves) >= MIN_RUNS else 0,
        num_recoveries=len(restarts) if startup is not None else 0,
    )
