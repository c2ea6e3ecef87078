"""Which cluster a spec runs on: the one it pins, else the one whose plan predicts best.

The database's facts about each cluster (its nodes as last synced, its spares, what its
queued runs still lack, whether its controller answered the reconciler, the corrections
its own runs give the planner) are read first, in the request's transaction; the planner
then runs on each cluster's hardware and network with no transaction waiting on it
(`runs/service.py` rolls back before reading the owner's files). The rule that picks among
the plans is pure, in service/clusters/choice.py.

- One cluster configured, nothing pinned: the run goes there, exactly as before clusters
  were configurable (no reachability or size check: a run is accepted while Slurm is down
  and waits for it).
- Pinned: the run goes there or is refused at submit: 422 `cluster_cannot_run` naming the
  cluster and why (no layout on its hardware, too few nodes, too few GPUs a node), 409
  `cluster_unreachable` when its controller has not answered the reconciler (submit
  without `cluster:`, or when `runyard cluster list` shows it reachable).
- Several, nothing pinned: each cluster's plan becomes a `ClusterOption`; the rule picks
  one; none fits: 422 `no_cluster_fits` with each cluster's reason. When the only reason
  is that no controller answers, the run waits on the default cluster, as above.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy.orm import Session

from contract import ModelShape
from planner.calibration import Calibration
from planner.resolve import LayoutError, Resolved
from service.clusters import registry
from service.clusters.choice import ClusterOption, Unfit, choose_cluster, why_chosen
from service.clusters.reachability import Reachability, reachability
from service.clusters.repository import PlacementCounts, placement_counts, spare_targets
from service.config import Settings
from service.config_areas.clusters import ClusterConfig
from service.errors import AppError, InvalidSpec
from service.models.base import utcnow
from service.plans.service import calibration_for
from service.runs.planning import plan_layout
from service.runs.schemas import RunSpec


class ClusterCannotRun(AppError):
    """The spec pins a cluster that cannot run it."""

    status_code = 422
    code = "cluster_cannot_run"


class NoClusterFits(AppError):
    """No configured cluster can run the spec."""

    status_code = 422
    code = "no_cluster_fits"


class ClusterUnreachable(AppError):
    """The spec pins a cluster whose controller does not answer."""

    status_code = 409
    code = "cluster_unreachable"


@dataclass(frozen=True)
class ClusterFacts:
    """What the database says of one cluster a spec may run on, read before planning."""

    config: ClusterConfig
    settings: Settings  # the site's, with the cluster's hardware (registry.planning_settings)
    counts: PlacementCounts  # all zero: the reconciler has not synced its nodes yet
    spare_target: int
    reach: Reachability | None  # None: never read, taken as reachable
    calibration: Calibration | None


@dataclass(frozen=True)
class ClusterPlan:
    """One cluster's plan for the spec and the figures the rule weighed."""

    config: ClusterConfig
    option: ClusterOption
    resolved: Resolved | None  # None: the planner found no layout there


@dataclass(frozen=True)
class Placement:
    """Where the spec runs, with what plan, and the plans of every cluster weighed."""

    cluster: ClusterConfig
    resolved: Resolved
    plans: tuple[ClusterPlan, ...]
    why: str  # one sentence: why this cluster (the dry run shows it)


def candidates(settings: Settings, spec: RunSpec) -> tuple[ClusterConfig, ...]:
    """The clusters the spec may run on: the one it pins (UnknownCluster, 422, for a name
    the service does not drive), else every configured one, the default first."""
    if spec.cluster is not None:
        return (registry.find_cluster(settings, spec.cluster),)
    return registry.clusters(settings)


def read_facts(
    session: Session,
    settings: Settings,
    spec: RunSpec,
    configs: Sequence[ClusterConfig] | None = None,
) -> list[ClusterFacts]:
    """The facts of every candidate cluster (or of `configs`: the clusters a run may fail
    over to, reconcile/failover.py), in a few queries."""
    counts, targets = placement_counts(session), spare_targets(session)
    reach = reachability(session)
    facts = []
    for config in candidates(settings, spec) if configs is None else configs:
        on = registry.planning_settings(settings, config)
        facts.append(
            ClusterFacts(
                config=config,
                settings=on,
                counts=counts.get(config.name, PlacementCounts()),
                spare_target=targets.get(config.name, config.spare_pool_target or 0),
                reach=reach.get(config.name),
                calibration=calibration_for(session, on, on.hardware, spec.uncalibrated),
            )
        )
    return facts


def place(spec: RunSpec, shape: ModelShape, facts: list[ClusterFacts]) -> Placement:
    """Plan the spec on each candidate and choose (module docstring). Raises
    InvalidSpec (one cluster, as before), ClusterCannotRun, ClusterUnreachable or
    NoClusterFits."""
    if len(facts) == 1 and spec.cluster is None:
        only = facts[0]
        try:
            resolved = plan_layout(spec, shape, only.settings, only.calibration)
        except LayoutError as exc:
            raise InvalidSpec(str(exc)) from exc
        option = option_of(only, spec, resolved, None, "")
        return Placement(only.config, resolved, (ClusterPlan(only.config, option, resolved),), "")
    plans = [plan_on(f, spec, shape) for f in facts]
    if spec.cluster is not None:
        return _pinned(plans[0])
    choice = choose_cluster([p.option for p in plans])
    if choice is None:
        return _none_fits(plans)
    chosen = next(p for p in plans if p.option is choice.chosen)
    assert chosen.resolved is not None  # it fits: the planner found a layout
    return Placement(chosen.config, chosen.resolved, tuple(plans), why_chosen(choice))


def plan_on(facts: ClusterFacts, spec: RunSpec, shape: ModelShape) -> ClusterPlan:
    """The spec planned on one cluster, and whether that cluster can run it."""
    try:
        resolved: Resolved | None = plan_layout(spec, shape, facts.settings, facts.calibration)
    except LayoutError as exc:
        option = option_of(facts, spec, None, Unfit.NO_LAYOUT, str(exc))
        return ClusterPlan(facts.config, option, None)
    unfit, why = unfit_for(facts, spec)
    return ClusterPlan(facts.config, option_of(facts, spec, resolved, unfit, why), resolved)


def unfit_for(facts: ClusterFacts, spec: RunSpec) -> tuple[Unfit | None, str]:
    """Why a cluster the planner found a layout on still cannot run the spec, or (None, "").
    A cluster whose nodes were never synced is not refused: nothing is known against it."""
    if facts.reach is not None and facts.reach.unreachable_since is not None:
        since = facts.reach.unreachable_since
        silent_s = facts.reach.unreachable_for_s(utcnow()) or 0.0
        return Unfit.UNREACHABLE, (
            f"its controller has not answered since {since:%Y-%m-%d %H:%M:%S} UTC "
            f"({silent_s:.0f} s): {facts.reach.detail}"
        )
    counts = facts.counts
    if counts.num_nodes and counts.num_nodes < spec.nodes:
        return Unfit.TOO_FEW_NODES, (
            f"it has {counts.num_nodes} nodes, the spec asks for {spec.nodes}"
        )
    # A CPU node's ranks are not its GPUs; 0 GPUs is a Slurm without GPU gres: unknown.
    gpu = facts.settings.accelerator == "gpu" and counts.gpus_per_node > 0
    if gpu and counts.gpus_per_node < spec.gpus_per_node:
        return Unfit.TOO_FEW_NODES, (
            f"its nodes have {counts.gpus_per_node} GPUs, the spec asks for "
            f"gpus_per_node {spec.gpus_per_node}"
        )
    return None, ""


def option_of(
    facts: ClusterFacts, spec: RunSpec, resolved: Resolved | None, unfit: Unfit | None, why: str
) -> ClusterOption:
    """The figures the rule weighs: the plan's, and the cluster's free nodes beyond what
    its spare pool still lacks and what its queued runs still lack."""
    counts = facts.counts
    shortfall = max(0, facts.spare_target - counts.num_spares)
    free = max(0, counts.num_free - shortfall - counts.queued_need)
    plan = resolved.plan if resolved is not None else None
    return ClusterOption(
        name=facts.config.name,
        need_nodes=spec.nodes,
        unfit=unfit,
        why_unfit=why,
        step_time_s=plan.step_time_s if plan else 0.0,
        goodput=plan.goodput if plan else 0.0,
        mtbi_h=plan.mtbi_h if plan else 0.0,
        spares_needed=plan.spare_nodes if plan else 0,
        num_spares=counts.num_spares,
        free_nodes=free,
    )


def _pinned(plan: ClusterPlan) -> Placement:
    option = plan.option
    if option.unfit is Unfit.UNREACHABLE:
        raise ClusterUnreachable(
            f"cluster {option.name!r}: {option.why_unfit}; submit without `cluster:` to let "
            "the service choose, or again once `runyard cluster list` shows it reachable"
        )
    if option.unfit is not None or plan.resolved is None:
        raise ClusterCannotRun(
            f"cluster {option.name!r} ({plan.config.hardware}) cannot run this spec: "
            f"{option.why_unfit}; pin another cluster or leave `cluster:` out"
        )
    return Placement(plan.config, plan.resolved, (plan,), f"{option.name}: pinned by the spec")


def _none_fits(plans: list[ClusterPlan]) -> Placement:
    """No cluster can run the spec now. Where every cluster with a layout only lacks an
    answering controller, the run waits on the first of them (the default when it is one),
    as a one-cluster service accepts runs while its Slurm is down."""
    planned = [p for p in plans if p.resolved is not None]
    if planned and all(p.option.unfit is Unfit.UNREACHABLE for p in planned):
        first = planned[0]
        assert first.resolved is not None
        why = f"{first.config.name}: no cluster answers now; the run waits for it"
        return Placement(first.config, first.resolved, tuple(plans), why)
    reasons = "; ".join(f"{p.config.name}: {p.option.why_unfit}" for p in plans)
    raise NoClusterFits(f"no configured cluster can run this spec ({reasons})")
