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

With `clusters=2` a second cluster of the same size stands by, and with `outage_scale` the
clusters go down whole at the published rate (sim/outages.py). While its cluster is down the
run waits; at every change the service's failover rule (service/clusters/failover.py) says
whether it stays, waits, or moves, and a move restarts it on the other cluster from its last
committed checkpoint, where it stays. With one cluster the same rule finds no other cluster
and the run waits the outage out: the comparison the bench prints.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from planner import reliability
from service.clusters.failover import FailoverAction, MoveCost, OtherCluster, RunCluster
from service.config import Settings
from service.models import RecoveryAction, RecoveryPath
from sim import failures, outages
from sim.cluster import Cluster
from sim.costs import NCCL_TRANSPORT_TIMEOUT_S, phase_costs
from sim.failures import NODES_PER_LEAF, Failure, Report
from sim.ledger import Ledger, Use
from sim.live_interval import LiveInterval
from sim.outages import Outage
from sim.policy import Policy
from sim.run_config import SimConfig, SimResult
from sim.run_shape import HARDWARE, RunShape, planned_run

INF = math.inf
LIVE_EVERY_S = 3600.0  # the live interval is also looked at hourly: failures leave its window


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
        self.home = 0  # the index of the run's cluster
        self.down: dict[int, Outage] = {}  # the clusters out now
        self.down_seen = 0.0  # when the service saw the run's cluster go
        self.lost_s = 0.0  # training lost when it went
        self.costs = phase_costs(
            self.run.model,
            num_gpus=self.run.num_gpus,
            group_gpus=self.run.group_gpus,
            step_s=self.run.step_s,
            settings=self.settings,
            assumptions=assumptions,
        )
        self.cycle_s = self.interval_s + self.costs.checkpoint_stall_s
        self.copy_s = 0.0 if config.shared_checkpoint else self.costs.checkpoint_copy_s
        self.limit_s = self.policy.failover_limit_s(
            config.failover_after_s
            if config.failover_after_s is not None
            else self.settings.failover_after_s,
            self.copy_s,
        )
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
        self.outages_hit = 0
        self.moves: list[MoveCost] = []
        self.decisions: Counter[str] = Counter()

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
        cfg = self.cfg
        for o in outages.draw_outages(
            cfg.seed, days=cfg.days, clusters=cfg.clusters, scale=cfg.outage_scale
        ):
            self.at(o.at_s, "outage", o)
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
            outages_hit=self.outages_hit,
            moves=self.moves,
            decisions=self.decisions,
            failover_limit_s=self.limit_s,
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

    def lose_work_since_commit(self, t: float) -> float:
        """A classic restore: what was trained after the newest committed checkpoint is
        redone. Save k blocks at train_start + k x cycle and commits write_s later. The
        seconds of training lost."""
        k = math.floor((t - self.write_s - self.train_start) / self.cycle_s)
        restore = self.train_start + max(0, k) * self.cycle_s
        lost = 0.0
        for s0, s1, w in self.segments:
            lo, hi = max(s0, restore), min(s1, t)
            if hi > lo:
                self.ledger.move(Use.PRODUCTIVE, Use.RECOMPUTE, lo, hi, w)
                lost += (hi - lo) * w
        self.segments = []
        return lost

    # --- events ---------------------------------------------------------------------------

    def on_fail(self, t: float, f: Failure) -> None:
        if self.home in self.down:
            return  # the run's nodes are not running: its cluster is out
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
                self.at(back, "repaired", (cluster, node))
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
                self.at(back, "repaired", (cluster, node))
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

    def on_repaired(self, t: float, payload: tuple[Cluster, str]) -> None:
        cluster, node = payload
        cluster.repaired(node)
        cluster.refill()  # the reconciler's order: spares first, then placement
        if cluster is not self.cluster or self.home in self.down:
            return  # a cluster the run left, or the run's own while it is out
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

    # --- whole-cluster outages and failover (sim/outages.py, service/clusters) ----------

    def on_outage(self, t: float, o: Outage) -> None:
        if o.cluster in self.down and self.down[o.cluster].until_s >= o.until_s:
            return  # inside a longer outage of the same cluster
        self.down[o.cluster] = o
        self.at(o.until_s, "outage_end", o)
        if o.cluster != self.home:
            return
        self.outages_hit += 1
        self.lost_s = 0.0
        if self.stop is None or not self.stop.classic:
            self.lost_s = self.lose_work_since_commit(t)
        self.groups_out.clear()
        self.begin_stop(t, [(Use.CLUSTER_DOWN, INF)], classic=True)
        # The service sees a silent controller at its next tick, dead nodes by their
        # heartbeats; it asks the rule at every tick, which changes its answer at the limit.
        tick = self.settings.reconcile_interval_s
        seen = tick if o.cause.controller_down else self.costs.detect_s[Report.HEARTBEAT]
        self.down_seen = t + seen
        self.at(self.down_seen + math.ceil(self.limit_s / tick) * tick, "recheck", self.stop_id)

    def on_outage_end(self, t: float, o: Outage) -> None:
        if self.down.get(o.cluster) is not o:
            return
        del self.down[o.cluster]
        stop = self.stop
        if stop is None or stop.phases[-1] != (Use.CLUSTER_DOWN, INF):
            return
        if o.cluster == self.home:  # back before the run moved: it restarts at home
            stop.phases[-1] = (Use.CLUSTER_DOWN, t)
            self.restart(t)
        else:  # another cluster is back: it may take the run now
            self.on_recheck(t, self.stop_id)

    def on_recheck(self, t: float, stop_id: int) -> None:
        """The service's failover rule for the run, its cluster out since `down_seen`."""
        if stop_id != self.stop_id or self.home not in self.down:
            return
        controller_down = self.down[self.home].cause.controller_down
        waited = max(0.0, t - self.down_seen)
        home = RunCluster(
            name=str(self.home),
            unreachable_for_s=waited if controller_down else None,
            healthy_nodes=0,
            spare_nodes=0,
            short_for_s=waited,
            run_stepping=False,
        )
        size = self.run.num_nodes + self.cluster.pool_target
        free = size if self.cfg.other_free_nodes is None else self.cfg.other_free_nodes
        others = [
            OtherCluster(
                name=str(c),
                hardware=HARDWARE,
                reachable=c not in self.down or not self.down[c].cause.controller_down,
                free_nodes=0 if c in self.down else free,
                mounts_checkpoint=self.cfg.shared_checkpoint,
            )
            for c in range(self.cfg.clusters)
            if c != self.home
        ]
        decision = self.policy.failover_decision(
            home, others, self.run.num_nodes, HARDWARE, self.limit_s
        )
        self.decisions[decision.reason.value] += 1
        if decision.action == FailoverAction.FAIL_OVER and decision.target is not None:
            self.fail_over(t, int(decision.target))

    def fail_over(self, t: float, target: int) -> None:
        """The run starts on `target` from its last committed checkpoint (its work since
        was already counted lost when its cluster went) and stays there."""
        assert self.stop is not None
        cost = self.policy.move_cost(
            waited_s=t - self.stop.start,
            resubmit_s=self.costs.resubmit_s,
            queue_start_s=self.costs.queue_start_s,
            start_and_init_s=self.costs.start_and_init_s,
            restore_s=self.costs.checkpoint_read_s,
            copy_s=self.copy_s,
            lost_work_s=self.lost_s,
        )
        self.moves.append(cost)
        self.home = target
        self.cluster = Cluster(
            self.policy, run_nodes=self.run.num_nodes, pool_target=self.cluster.pool_target
        )
        self.broken_in_run.clear()
        end = t + cost.requeue_start_s + cost.checkpoint_copy_s + cost.restore_s
        self.stop.phases[-1] = (Use.CLUSTER_DOWN, t)
        self.stop.phases.append((Use.FAILOVER, end))
        self.at(end, "resume", self.stop_id)


def simulate(config: SimConfig, run: RunShape | None = None) -> SimResult:
    return Simulation(config, run).simulate()
