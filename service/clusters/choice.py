"""Which cluster a run that pins none goes to: the rule, pure, from what each cluster's plan
predicts.

The API plans the spec on every configured cluster (its hardware, its network; service/runs/
cluster_placement.py) and hands this module one `ClusterOption` per cluster. The rule, in
order, each step deciding only between options the previous ones left equal:

1. Only a cluster that can run the spec: its controller answers, the planner found a layout
   on its hardware, and it has as many nodes as the spec asks (its healthy nodes and spares).
2. One where the run can start now beats one where it must wait: enough free healthy nodes
   beyond what its spare pool still lacks and what runs queued there before it still lack.
3. The shortest expected wall-clock time per productive step: the plan's step time on the
   cluster's GPUs divided by the goodput the run would have with that cluster's spares
   (`goodput_with_spares`). A faster GPU type wins unless its cluster's spares are so few
   that failures eat the difference.
4. The name, so the choice is the same however often it is asked.

A run never spans clusters: the choice is one cluster, and placement, spares and recovery
then stay inside it (service/reconcile/loop.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum

# planner/reliability.py's ReliabilityAssumptions.repair_window_h: a failed node stays out of
# the pool this long before it is repaired or replaced (the planner's own assumption).
REPAIR_WINDOW_H = 24.0


class ChoiceReason(StrEnum):
    """Why the chosen cluster won, as the dry run shows it: the first rule that told it
    apart from the runner-up."""

    ONLY_ONE = "only_one"  # the only cluster that can run the spec
    STARTS_NOW = "starts_now"  # it can start now, the runner-up must wait
    FASTER = "faster"  # the shorter expected time per productive step
    NAME = "name"  # equal on every figure: the first by name


class Unfit(StrEnum):
    """Why a cluster cannot run the spec."""

    UNREACHABLE = "unreachable"  # its controller has not answered the reconciler
    NO_LAYOUT = "no_layout"  # the planner found no layout on its hardware
    TOO_FEW_NODES = "too_few_nodes"  # it has fewer nodes than the spec asks


@dataclass(frozen=True)
class ClusterOption:
    """One cluster as the plan for the spec sees it."""

    name: str
    need_nodes: int  # what the spec asks
    unfit: Unfit | None  # None: it can run the spec
    why_unfit: str = ""  # the planner's or the counts' words, for the 422 and the dry run
    step_time_s: float = 0.0  # the plan's step time on its GPUs
    goodput: float = 0.0  # the plan's goodput, with a spare at every failure
    mtbi_h: float = math.inf  # the plan's mean time between interruptions of the run
    spares_needed: int = 0  # the plan's hot spares (planner/reliability.py)
    num_spares: int = 0  # hot spares in its pool now
    free_nodes: int = 0  # free healthy nodes beyond its pool's shortfall and its queue

    @property
    def fits(self) -> bool:
        return self.unfit is None

    @property
    def starts_now(self) -> bool:
        return self.fits and self.free_nodes >= self.need_nodes

    @property
    def spares_for_run(self) -> int:
        """What a failed node of the run can be replaced by: the pool, and the free nodes
        the run itself leaves (placement takes free nodes first, reconcile/placement.py)."""
        return self.num_spares + max(0, self.free_nodes - self.need_nodes)

    @property
    def expected_goodput(self) -> float:
        return goodput_with_spares(
            self.goodput, self.mtbi_h, self.spares_for_run, self.spares_needed
        )

    @property
    def time_per_step_s(self) -> float:
        """Expected wall-clock seconds per productive step: step time over goodput."""
        goodput = self.expected_goodput
        return self.step_time_s / goodput if goodput > 0 else math.inf


@dataclass(frozen=True)
class ClusterChoice:
    chosen: ClusterOption
    reason: ChoiceReason
    runner_up: ClusterOption | None  # the best of the rest that can run the spec


def goodput_with_spares(
    goodput: float,
    mtbi_h: float,
    spares: int,
    spares_needed: int,
    repair_window_h: float = REPAIR_WINDOW_H,
) -> float:
    """The plan's `goodput` (a spare at every failure) less what failures that find no
    spare cost: failures in a repair window are Poisson with mean window / MTBI; each one
    beyond `spares` waits for a repaired node, half a window on average, so the share lost
    is E[max(0, N - spares)] / 2. With the planner's `spares_needed` or more, the plan's
    goodput stands (its pool makes running out under 1 % likely)."""
    if spares >= spares_needed or not math.isfinite(mtbi_h) or mtbi_h <= 0:
        return goodput
    mean = repair_window_h / mtbi_h
    # E[max(0, N - s)] = mean - s + sum_{k<s} (s - k) P(N = k)
    below = sum((spares - k) * math.exp(-mean) * mean**k / math.factorial(k) for k in range(spares))
    excess = mean - spares + below
    return max(0.0, goodput * (1.0 - excess / 2.0))


def _rank(option: ClusterOption) -> tuple[bool, float, str]:
    return (not option.starts_now, option.time_per_step_s, option.name)


def choose_cluster(options: Sequence[ClusterOption]) -> ClusterChoice | None:
    """The cluster the rule (module docstring) picks among `options`; None when none can
    run the spec (each option's `why_unfit` says why)."""
    fitting = sorted((o for o in options if o.fits), key=_rank)
    if not fitting:
        return None
    chosen = fitting[0]
    if len(fitting) == 1:
        return ClusterChoice(chosen, ChoiceReason.ONLY_ONE, None)
    runner_up = fitting[1]
    if chosen.starts_now != runner_up.starts_now:
        reason = ChoiceReason.STARTS_NOW
    elif chosen.time_per_step_s != runner_up.time_per_step_s:
        reason = ChoiceReason.FASTER
    else:
        reason = ChoiceReason.NAME
    return ClusterChoice(chosen, reason, runner_up)


def why_chosen(choice: ClusterChoice) -> str:
    """One sentence for the dry run: why the chosen cluster won over the runner-up."""
    chosen, other = choice.chosen, choice.runner_up
    if other is None:
        return f"{chosen.name}: the only cluster that can run the spec"
    if choice.reason is ChoiceReason.STARTS_NOW:
        return (
            f"{chosen.name}: it can start now ({chosen.free_nodes} free nodes for "
            f"{chosen.need_nodes}); {other.name} has {other.free_nodes} free"
        )
    if choice.reason is ChoiceReason.FASTER:
        return (
            f"{chosen.name}: {chosen.time_per_step_s:.3f} s per productive step "
            f"(step {chosen.step_time_s:.3f} s, goodput {chosen.expected_goodput:.1%}) "
            f"against {other.name}'s {other.time_per_step_s:.3f} s "
            f"(step {other.step_time_s:.3f} s, goodput {other.expected_goodput:.1%})"
        )
    return f"{chosen.name}: equal to {other.name} on every figure, first by name"
