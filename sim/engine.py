"""A discrete-event simulation of one long run under failures, decided by the service's code.

A plain event heap, not simpy: the model has no processes that wait on resources, only
timed phase changes (a failure, a detection, a restart done, a group back, a node
repaired), so a heap of (time, sequence, event) is all it needs; the sequence number makes
ties, and so every result, deterministic for a seed, and 30 days take milliseconds.

The run trains in replica groups (the planner's data-parallel replicas). A failure is
reported as its cause would be (sim/failures.py), classified by the service's table,
drained or restarted in place as the service does, and recovered on the path the service's
`choose_recovery_path` picks: FAST (only the failed groups restart onto spares and heal
from a live peer; the others lose a step) or CLASSIC (the whole run restarts from its last
committed checkpoint). Every second of the allocation lands in the ledger (sim/ledger.py).
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from planner import reliability
from service.config import Settings
from service.models import RecoveryAction, RecoveryPath
from sim import failures
from sim.cluster import Cluster
from sim.costs import NCCL_TRANSPORT_TIMEOUT_S, PhaseCosts, phase_costs
from sim.failures import NODES_PER_LEAF, Failure, Report
from sim.ledger import Ledger, Use
from sim.live_interval import LiveInterval
from sim.policy import Policy
from sim.run_shape import RunShape, planned_run

INF = math.inf
LIVE_EVERY_S = 3600.0  # the live interval is also looked at hourly: failures leave its window


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


@dataclass
class Stop:
    """The whole run is stopped: consecutive phases, the last one may be open (INF)."""

    start: float
    phases: list[tuple[Use, float]] = field(default_factory=list)
    classic: bool = True


class Simulation:
    def __init__(
        self, config: SimConfig, run: RunShape | None = None, settings: Settings | None = None
    ) -> None:
        self.cfg = config
        self.run = run or planned_run()
        self.settings = settings or Settings()
        self.policy = Policy(self.settings)
        self.rng = random.Random(config.seed)
        # The planner is asked about this run's own replica groups (its fast path's unit).
        assumptions = reliability.ReliabilityAssumptions(
            failures_per_gpu_hour=reliability.DEFAULT_FAILURES_PER_GPU_HOUR * config.scale,
            replica_groups=self.run.replica_groups,
        )
        self.assumptions = assumptions
        rel = self.policy.reliability(
            self.run.model, self.run.num_gpus, self.run.step_s, assumptions
        )
        self.interval_s = (
            self.policy.checkpoint_interval_s(rel, fast_path=config.fast_path)
            if config.interval_s is None
            else config.interval_s
        )
        self.write_s = rel.checkpoint_write_s
        pool = rel.spare_nodes
        if config.pool is not None:
            pool = config.pool
        elif config.leaf_aware:
            pool = self.policy.pool_target(rel.spare_nodes, NODES_PER_LEAF, self.run.num_nodes)
        rate_per_h = failures.failure_rate_per_s(self.run.num_gpus, config.scale) * 3600
        self.reserve = self.policy.reserve(rate_per_h) if config.leaf_aware else None
        self.cluster = Cluster(self.policy, run_nodes=self.run.num_nodes, pool_target=pool)
        self.costs = phase_costs(
            self.run.model,
            num_gpus=self.run.num_gpus,
            group_gpus=self.run.group_gpus,
            step_s=self.run.step_s,
            settings=self.settings,
            assumptions=assumptions,
        )
        self.cycle_s = self.interval_s + self.costs.checkpoint_stall_s
        self.live = (
            LiveInterval(
                self.settings,
                cluster_nodes=len(self.cluster.switch),
                run_nodes=self.run.num_nodes,
                gpus_per_node=8,
                stall_s=self.costs.checkpoint_stall_s,
                step_s=self.run.step_s,
                start_interval_s=self.interval_s,
            )
            if config.live_interval
            else None
        )
        self.horizon = config.days * 86400
        self.ledger = Ledger(self.horizon)
        self.events: list[tuple[float, int, str, Any]] = []
        self.seq = 0
        self.t_last = 0.0
        self.stop: Stop | None = None
        self.stop_id = 0
        self.train_start = 0.0
        self.segments: list[tuple[float, float, float]] = []  # trained since train_start
        self.groups_out: dict[int, tuple[Use, float, int]] = {}  # group -> use, ready, token
        self.broken_in_run: set[str] = set()  # broken but not drained: restarts fail on it
        self.app_errors: dict[str, int] = {}
        self.recoveries: Counter[str] = Counter()
        self.classic_because: Counter[str] = Counter()
        self.pool_ran_dry = False
        self.nodes_without_spare = 0
        self.held_back = 0
        self.single_found_none = False
        self.leaf_failures = 0
        self.failures = 0
        self.drained = 0
        self.same_leaf = 0
        self.spares_used = 0

    # --- the event queue ------------------------------------------------------------------

    def at(self, t: float, kind: str, payload: Any = None) -> None:
        if t < self.horizon:
            heapq.heappush(self.events, (t, self.seq, kind, payload))
            self.seq += 1

    def simulate(self) -> SimResult:
        for f in failures.draw_failures(
            self.rng,
            days=self.cfg.days,
            num_nodes=self.run.num_nodes,
            gpus_per_node=8,
            num_leaves=len(self.cluster.leaves),
            scale=self.cfg.scale,
        ):
            self.at(f.at_s, "fail", f)
        if self.live is not None:
            self.at(LIVE_EVERY_S, "rederive")
        while self.events:
            t, _, kind, payload = heapq.heappop(self.events)
            self.advance(t)
            getattr(self, f"on_{kind}")(t, payload)
        self.advance(self.horizon)
        return SimResult(
            config=self.cfg,
            goodput=self.ledger.goodput(),
            badput=self.ledger.badput_shares(),
            recoveries=self.recoveries,
            classic_because=self.classic_because,
            worst_hour=self.ledger.worst_hour(),
            pool_size=self.cluster.pool_target,
            pool_ran_dry=self.pool_ran_dry,
            nodes_without_spare=self.nodes_without_spare,
            held_back=self.held_back,
            single_found_none=self.single_found_none,
            leaf_failures=self.leaf_failures,
            failures=self.failures,
            drained=self.drained,
            spares_same_leaf=self.same_leaf,
            spares_used=self.spares_used,
            checkpoint_interval_s=self.interval_s,
            costs=self.costs,
        )

    # --- where the time goes --------------------------------------------------------------

    def groups_now(self) -> int:
        return len(self.cluster.slots) // self.run.group_nodes

    def advance(self, now: float) -> None:
        """Charge [t_last, now) to the ledger under the current state."""
        t0, self.t_last = self.t_last, now
        if now <= t0:
            return
        if self.stop is not None:
            start = self.stop.start
            for use, end in self.stop.phases:
                self.ledger.charge(use, max(t0, start), min(now, end))
                start = end
            return
        planned = self.run.replica_groups
        active = self.groups_now() - len(self.groups_out)
        train = active / planned * self.interval_s / self.cycle_s
        self.ledger.charge(Use.PRODUCTIVE, t0, now, train)
        self.ledger.charge(Use.CHECKPOINT, t0, now, active / planned - train)
        for use, _, _ in self.groups_out.values():
            self.ledger.charge(use, t0, now, 1 / planned)
        self.ledger.charge(Use.DEGRADED, t0, now, (planned - self.groups_now()) / planned)
        self.segments.append((t0, now, train))

    def lose_work_since_commit(self, t: float) -> None:
        """A classic restore: what was trained after the newest committed checkpoint is
        redone. Save k blocks at train_start + k x cycle and commits write_s later."""
        k = math.floor((t - self.write_s - self.train_start) / self.cycle_s)
        restore = self.train_start + max(0, k) * self.cycle_s
        for s0, s1, w in self.segments:
            lo, hi = max(s0, restore), min(s1, t)
            if hi > lo:
                self.ledger.move(Use.PRODUCTIVE, Use.RECOMPUTE, lo, hi, w)
        self.segments = []

    # --- events ---------------------------------------------------------------------------

    def on_fail(self, t: float, f: Failure) -> None:
        if self.live is not None:  # the service counts it, and may move the interval
            self.live.observe(t)
            self.rederive(t)
        cluster = self.cluster
        # One repair time for every node the failure took: a leaf switch is replaced once.
        back = t + failures.repair_s(self.rng, f.cause, self.assumptions.repair_window_h)
        if f.leaf is not None:
            hit = cluster.nodes_on_leaf(f.leaf)
            hit_set = set(hit)
            in_run = {n: i for i, n in enumerate(cluster.slots) if n in hit_set}
        else:
            slot = (f.slot or 0) % len(cluster.slots)
            node = cluster.slots[slot]
            hit = [node] if node else []
            in_run = {node: slot} if node else {}
        for node in hit:
            if node not in in_run and node not in cluster.repairing:
                # A spare or a free node: the service drains what is ours; either way it is
                # out until repaired.
                cluster.drain(node, f.cause.signal)
                self.at(back, "repaired", node)
        if not in_run:
            return
        self.failures += 1
        self.leaf_failures += f.leaf is not None
        failed_groups: set[int] = set()
        drained: dict[int, str] = {}  # slot -> the failed node drained from it
        for node, slot in sorted(in_run.items(), key=lambda x: x[1]):
            action = self.policy.action(f.cause.signal, self.app_errors, node)
            if action == RecoveryAction.DRAIN_AND_MOVE:
                cluster.drain(node, f.cause.signal)
                cluster.set_slot(slot, None)
                self.drained += 1
                self.at(back, "repaired", node)
                drained[slot] = node
            elif f.cause.broken:
                self.broken_in_run.add(node)  # restarted in place on a broken node
            group = slot // self.run.group_nodes
            if group < self.groups_now():
                failed_groups.add(group)
        detect = self.costs.detect_s[f.cause.report]
        if not failed_groups:
            self.replace(drained, others_train=True)
            return  # an idle node of a shrunk run
        in_classic = self.stop is not None and self.stop.classic
        why: str
        if in_classic:
            path, why = RecoveryPath.CLASSIC, "during a classic recovery"
        elif self.cfg.fast_path:
            path, because = self.policy.path(
                self.groups_now(), failed_groups | set(self.groups_out)
            )
            why = because.value if because else ""
        else:
            path, why = RecoveryPath.CLASSIC, "classic path only"
        self.replace(drained, others_train=path == RecoveryPath.FAST)
        self.recoveries[path.value] += 1
        if path == RecoveryPath.FAST:
            self.fast(t, f.cause.report, failed_groups, detect)
            return
        self.classic_because[why] += 1
        if not in_classic:
            self.lose_work_since_commit(t)
        self.groups_out.clear()  # the whole run restarts
        self.begin_stop(t, [(Use.DETECTION, t + detect)], classic=True)
        self.at(t + detect, "detected", self.stop_id)

    def on_rederive(self, t: float, _: Any) -> None:
        self.rederive(t)
        self.at(t + LIVE_EVERY_S, "rederive")

    def rederive(self, t: float) -> None:
        """The live interval (the service's policy) at `t`: a new one counts its cycles from
        the newest committed save, which a classic restore would return to."""
        new = self.live.update(t) if self.live is not None else None
        if new is None:
            return
        if self.stop is None or not self.stop.classic:
            committed = math.floor((t - self.write_s - self.train_start) / self.cycle_s)
            self.train_start += max(0, committed) * self.cycle_s
        self.interval_s, self.cycle_s = new, new + self.costs.checkpoint_stall_s

    def replace(self, drained: dict[int, str], *, others_train: bool) -> None:
        """Spares for the drained slots: the service's grant (whole groups, a reserve kept
        for a leaf's failure), then its choice of spare for each node of a granted group."""
        if not drained:
            return
        cluster = self.cluster
        if self.reserve is None:  # the policy before: a spare per node, while any is left
            granted = set(drained)
        else:
            size = self.run.group_nodes if others_train else len(cluster.slots)
            missing = Counter(slot // size for slot in drained)
            groups = set(
                self.policy.grant(
                    dict(missing), len(cluster.spares), self.reserve, others_train=others_train
                )
            )
            granted = {slot for slot in drained if slot // size in groups}
            left = len(cluster.spares) - sum(missing[g] for g in groups)
            for g, need in missing.items():
                if g not in groups:
                    if left >= need:
                        self.held_back += need  # the spares are there: kept as the reserve
                    else:
                        self.pool_ran_dry = True
                    self.nodes_without_spare += need
        for slot, node in sorted(drained.items()):
            if slot not in granted:
                self.single_found_none |= len(drained) == 1
                continue
            spare = cluster.take_spare()
            cluster.set_slot(slot, spare)
            if spare is None:
                self.pool_ran_dry = True
                self.nodes_without_spare += 1
                self.single_found_none |= len(drained) == 1
            else:
                self.spares_used += 1
                self.same_leaf += cluster.switch[spare] == cluster.switch[node]
        cluster.hold_run()

    def fast(self, t: float, report: Report, groups: set[int], detect: float) -> None:
        if self.stop is None:
            stall = self.costs.survivor_stall_s[report]
            phases = [(Use.DETECTION, t + stall), (Use.RECOMPUTE, t + stall + self.run.step_s)]
            self.begin_stop(t, phases, classic=False)
            self.at(phases[-1][1], "resume", self.stop_id)
        for g in groups:
            self.group_out(g, t + detect)

    def group_out(self, g: int, ready_from: float) -> None:
        """Group g restarts once its nodes are there: resubmit, start, heal from a peer."""
        nodes = self.cluster.slots[g * self.run.group_nodes : (g + 1) * self.run.group_nodes]
        token = self.seq
        if any(n is None for n in nodes):
            self.groups_out[g] = (Use.WAITING_SPARE, INF, token)
        elif any(n in self.broken_in_run for n in nodes):
            self.groups_out[g] = (Use.DEGRADED, INF, token)  # fails again at every start
        else:
            ready = ready_from + self.costs.group_restart_s
            self.groups_out[g] = (Use.DEGRADED, ready, token)
            self.at(ready, "group_back", (g, token))

    def begin_stop(self, t: float, phases: list[tuple[Use, float]], *, classic: bool) -> None:
        self.stop_id += 1
        self.stop = Stop(t, phases, classic)

    def on_detected(self, t: float, stop_id: int) -> None:
        """Classic path: the failed nodes are drained and replaced; restart, shrink or wait."""
        if stop_id != self.stop_id or self.stop is None:
            return
        slots = self.cluster.slots
        held = sum(1 for n in slots if n)
        if held < len(slots) and self.policy.may_shrink(self.cfg.min_nodes, held):
            self.cluster.drop_holes()
            self.recoveries["shrink"] += 1
        if any(n is None for n in self.cluster.slots):
            self.stop.phases.append((Use.WAITING_SPARE, INF))
            return
        self.restart(t)

    def restart(self, t: float) -> None:
        assert self.stop is not None
        if any(n in self.broken_in_run for n in self.cluster.slots):
            # The new attempt dies on the broken node; its peers' collectives time out.
            end = t + self.costs.classic_restart_s + NCCL_TRANSPORT_TIMEOUT_S
            self.stop.phases.append((Use.RESTART, end))
            self.at(end, "detected", self.stop_id)
            return
        end = t + self.costs.classic_restart_s
        self.stop.phases.append((Use.RESTART, end))
        self.at(end, "resume", self.stop_id)

    def on_resume(self, t: float, stop_id: int) -> None:
        if stop_id != self.stop_id or self.stop is None:
            return
        if self.stop.classic:
            self.train_start, self.segments = t, []
        self.stop = None

    def on_group_back(self, t: float, payload: tuple[int, int]) -> None:
        g, token = payload
        if g in self.groups_out and self.groups_out[g][2] == token:
            del self.groups_out[g]

    def on_repaired(self, t: float, node: str) -> None:
        cluster = self.cluster
        cluster.repaired(node)
        cluster.refill()  # the reconciler's order: spares first, then placement
        stop = self.stop
        classic = stop is not None and stop.classic
        filled = cluster.fill_holes(None if classic else self.run.group_nodes, self.reserve)
        if not filled:
            return
        if stop is not None and classic and stop.phases[-1][1] == INF:
            if all(n is not None for n in cluster.slots):
                stop.phases[-1] = (Use.WAITING_SPARE, t)
                self.restart(t)
            return
        for g in {i // self.run.group_nodes for i in filled}:
            if g in self.groups_out and self.groups_out[g][1] == INF:
                self.group_out(g, t)


def simulate(config: SimConfig, run: RunShape | None = None) -> SimResult:
    return Simulation(config, run).simulate()
