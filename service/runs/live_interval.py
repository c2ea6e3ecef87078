"""Checkpoint intervals that follow the failures this cluster actually has.

At submission the planner picks a run's checkpoint interval by Young/Daly from a failure
rate assumed for the whole fleet (Llama 3's). The service counts every failure as it
happens, so while a run trains it re-derives the interval the same way from what it has
seen: the failure rate over the last `live_checkpoint_window_h` hours (incidents per
node-hour, by cause), this run's nodes, and the run's own measured save stall and step
time. The ranks learn the new interval from the reply to their next progress report
(workers/endpoints.py), and each change is an event on the run's timeline with the figures
behind it. A user's pinned interval (a spec that gives `checkpoint_every`) is kept, and so
is the planner's for a run split into replica groups (`follows_failures`).

The rate is the posterior mean of a Poisson rate under a Gamma prior worth PRIOR_EVENTS
failure at the published rate: (PRIOR_EVENTS + failures) / (PRIOR_EVENTS / prior + node
hours). A young or small cluster, which has seen little, stays near the published rate; a
cluster with a week of hundreds of nodes is ruled by its own count. When failures stop,
they leave the window and the interval returns towards the published rate's.

The pure part (`failure_rate`, `derive`) is what the failure simulation calls too
(sim/live_interval.py), so that the policy it scores is the service's own.
"""

from __future__ import annotations

import statistics
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from planner.reliability import DEFAULT_FAILURES_PER_GPU_HOUR, checkpoint_interval_s
from service.config import Settings
from service.models import Checkpoint, CheckpointState, Incident, Node, PlanOutcome, RecoveryAction
from service.models.base import utcnow
from service.runs.goodput_figures import checkpoint_stall_s
from service.runs.run_state_machine import record_event
from service.runs.schemas import RunSpec

# The Gamma prior's weight: one failure's worth of exposure at the published rate (the
# conjugate prior of shape 1 whose mean is that rate).
PRIOR_EVENTS = 1.0
# A change smaller than this share of the current interval is not announced: a step time
# and a save stall measured again move the optimum a few percent, and Daly's goodput is
# flat near its optimum (a 10 % longer or shorter interval costs < 0.1 % of goodput).
MIN_CHANGE = 0.10
# Incidents that interrupt a run (OBSERVE records only).
INTERRUPTING = (
    RecoveryAction.DRAIN_AND_MOVE,
    RecoveryAction.RESTART_SAME_NODES,
    RecoveryAction.COUNT_AND_ESCALATE,
    RecoveryAction.RESTART,
)
CONFIG_KEY = "checkpoint_interval"  # run.config[CONFIG_KEY]: {"pinned", "every", ...}


@dataclass(frozen=True, slots=True)
class FailureRate:
    """What the cluster saw over the window, and the rate it implies."""

    failures: int
    node_hours: float
    window_h: float
    by_cause: dict[str, int]
    per_node_hour: float


@dataclass(frozen=True, slots=True)
class Interval:
    """A re-derived interval and what it rests on."""

    steps: int
    interval_s: float
    mtbi_s: float  # mean time between interruptions of this run at the observed rate
    stall_s: float
    step_s: float


def prior_per_node_hour(gpus_per_node: int) -> float:
    """The published rate the estimate starts from (Llama 3's, per GPU-hour), per node."""
    return DEFAULT_FAILURES_PER_GPU_HOUR * gpus_per_node


def failure_rate(
    by_cause: dict[str, int], node_hours: float, window_h: float, prior: float
) -> FailureRate:
    """The posterior mean failure rate per node-hour (see the module docstring)."""
    failures = sum(by_cause.values())
    rate = (PRIOR_EVENTS + failures) / (PRIOR_EVENTS / prior + node_hours)
    return FailureRate(failures, node_hours, window_h, dict(by_cause), rate)


def derive(rate_per_node_hour: float, num_nodes: int, stall_s: float, step_s: float) -> Interval:
    """Daly's interval (planner.reliability, as at submission) for a run of `num_nodes`
    at this rate, in whole steps of `step_s`, for a save that stalls training `stall_s`."""
    mtbi_s = 3600 / (rate_per_node_hour * num_nodes)
    ideal = checkpoint_interval_s(stall_s, mtbi_s)
    steps = max(1, round(ideal / step_s))
    return Interval(steps, steps * step_s, mtbi_s, stall_s, step_s)


def is_pinned(spec: RunSpec) -> bool:
    """Whether the user gave the interval (kept) or left it to the service."""
    return "checkpoint_every" in spec.model_fields_set


def initial_config(spec: RunSpec) -> dict[str, Any]:
    """What a new run's config keeps of its interval."""
    return {"pinned": is_pinned(spec), "every": spec.checkpoint_every}


def current_every(run_config: dict[str, Any], spec_every: int) -> int:
    """The interval a run's ranks train with now: the live one, else the spec's."""
    return int((run_config.get(CONFIG_KEY) or {}).get("every", spec_every))


def follows_failures(run_config: dict[str, Any]) -> bool:
    """Whether the service chooses this run's interval. Not when the user pinned it, nor for
    a run split into replica groups: its disk checkpoints serve only the failures the fast
    path hands to the classic one (planner.reliability), which this count does not see."""
    state = run_config.get(CONFIG_KEY) or {}
    return bool(state) and not state.get("pinned", True) and not run_config.get("fault_tolerance")


def announced_every(run_config: dict[str, Any]) -> int | None:
    """What the progress reply tells the ranks: the service's interval, or None when it
    does not choose it (the ranks keep their config's)."""
    if not follows_failures(run_config):
        return None
    return int(run_config[CONFIG_KEY]["every"])


def observed_rate(session: Session, settings: Settings, now: datetime) -> FailureRate:
    """The cluster's failures over the window and its node-hours in it (each node from when
    the service first knew it)."""
    window = timedelta(hours=settings.live_checkpoint_window_h)
    since = now - window
    rows = session.execute(
        select(Incident.signal).where(
            Incident.created_at >= since, Incident.action.in_(INTERRUPTING)
        )
    ).scalars()
    by_cause = Counter(signal or "unknown" for signal in rows)
    node_hours = sum(
        (now - max(created, since)).total_seconds() / 3600
        for created in session.scalars(select(Node.created_at))
    )
    return failure_rate(
        dict(by_cause),
        node_hours,
        settings.live_checkpoint_window_h,
        prior_per_node_hour(gpus_per_node(session)),
    )


def gpus_per_node(session: Session) -> int:
    """GPUs per node of this cluster, as Slurm reports its nodes (8 when none is known)."""
    counts = [g for g in session.scalars(select(Node.num_gpus)) if g]
    return max(counts) if counts else 8


def measured_stall_s(session: Session, run_id: int, fallback_s: float) -> float:
    """The median save stall this run's workers measured; the plan's figure before any."""
    stalls = [
        checkpoint_stall_s(c)
        for c in session.scalars(
            select(Checkpoint).where(
                Checkpoint.run_id == run_id, Checkpoint.state == CheckpointState.COMMITTED
            )
        )
        if c.stall_s is not None or c.write_s is not None
    ]
    return statistics.median(stalls) if stalls else fallback_s


def rederive(session: Session, run: Any, settings: Settings) -> int | None:
    """The run's interval in steps, re-derived now if the service chooses it (None when it
    does not; the current one before the run has a measured step time). A change of at
    least MIN_CHANGE is stored in run.config and recorded on the run's timeline with its
    figures."""
    if not follows_failures(run.config):
        return None
    state = dict(run.config[CONFIG_KEY])
    outcome = session.get(PlanOutcome, run.id)
    if outcome is None or outcome.measured_step_s is None:
        return int(state["every"])
    now = utcnow()
    rate = observed_rate(session, settings, now)
    stall = measured_stall_s(session, run.id, outcome.predicted_checkpoint_s)
    new = derive(rate.per_node_hour, run.num_nodes, stall, outcome.measured_step_s)
    old = int(state["every"])
    if abs(new.steps - old) < MIN_CHANGE * old:
        return old
    run.config = {**run.config, CONFIG_KEY: {**state, "every": new.steps, "since": now.isoformat()}}
    record_event(
        session,
        run,
        "checkpoint.interval",
        f"checkpoint every {new.steps} steps (was {old}): {rate.failures} failures in "
        f"{rate.node_hours:,.0f} node-hours over {rate.window_h:g} h, "
        f"{rate.per_node_hour:.2e} per node-hour, one every {new.mtbi_s / 3600:.2f} h on "
        f"{run.num_nodes} nodes; save stall {new.stall_s:.2f} s, step {new.step_s:.3f} s",
        data={
            "from_steps": old,
            "to_steps": new.steps,
            "interval_s": new.interval_s,
            "failures": rate.failures,
            "by_cause": rate.by_cause,
            "node_hours": rate.node_hours,
            "window_h": rate.window_h,
            "failures_per_node_hour": rate.per_node_hour,
            "mtbi_s": new.mtbi_s,
            "stall_s": new.stall_s,
            "step_s": new.step_s,
        },
    )
    return new.steps
