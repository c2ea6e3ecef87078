"""What a simulation is asked (`SimConfig`) and what it answers (`SimResult`)."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from service.clusters.failover import MoveCost
from sim.costs import PhaseCosts


@dataclass(frozen=True)
class SimConfig:
    days: float = 30.0
    scale: float = 1.0  # x Llama 3's failure rate
    pool: int | None = None  # spare nodes; None: the size the policy gives
    fast_path: bool = True  # False: today's classic path for every failure
    seed: int = 0
    min_nodes: int | None = None  # the run's spec: shrink down to this rather than wait
    # The spare policy for correlated failures (service/recovery/spares.py): the pool sized
    # for one leaf switch besides the independent failures (capped at 1.5% of the nodes),
    # spares handed out by whole replica groups keeping a reserve. False: the policy before
    # it, as the reconciler still acts today: the planner's pool for independent failures
    # only, a spare for each failed node as it comes.
    leaf_aware: bool = True
    # Seconds of training between checkpoints; None: the planner's for the path the run
    # recovers on (`Reliability.interval_s_for`): the fast path's (Daly's for its classic
    # fallbacks, capped at an hour) when fast_path, else the classic one (Daly's).
    interval_s: float | None = None
    # The service's live interval (sim/live_interval.py): from the interval above, the run
    # is told a new one as the failures the cluster has seen over the window change it.
    live_interval: bool = False
    # Clusters of the run's size (run and pool); the run starts on the first. Whole-cluster
    # outages at this multiple of the published rate (sim/outages.py; 0: none).
    clusters: int = 1
    outage_scale: float = 0.0
    # The other clusters mount the filesystem of the run's checkpoint (else it is copied).
    shared_checkpoint: bool = True
    # The site's failover_after_s; None: the service's default (failover_limit_s).
    failover_after_s: float | None = None
    # Free nodes on each other cluster while it is up; None: the whole cluster.
    other_free_nodes: int | None = None


@dataclass
class SimResult:
    config: SimConfig
    goodput: float
    badput: dict[str, float]
    recoveries: Counter[str]
    classic_because: Counter[str]
    worst_hour: tuple[int, float]
    pool_size: int
    pool_ran_dry: bool  # a failed node found the pool empty, or short of its group's need
    nodes_without_spare: int  # failed nodes not replaced at once (dry or held back)
    held_back: int  # of them: left waiting for their leaf so that the reserve stays
    single_found_none: bool  # a one-node failure (the independent kind) found no spare
    leaf_failures: int  # whole-leaf failures that hit the run
    failures: int
    drained: int
    spares_same_leaf: int
    spares_used: int
    checkpoint_interval_s: float
    costs: PhaseCosts
    outages_hit: int = 0  # whole-cluster outages of the run's cluster while it ran there
    moves: list[MoveCost] = field(default_factory=list)  # each failover's cost
    decisions: Counter[str] = field(default_factory=Counter)  # the rule's reasons, as asked
    failover_limit_s: float = 0.0
