"""Slow nodes, decided against the fake Slurm (issue 15).

Rank 0's progress reports carry each node's slowest rank's update time; a node above 1.25x
its peers' median (and 0.02 s above it) for 5 consecutive reports is flagged SLOW. With the
`move` policy (the default) the run is asked to checkpoint and yield (StopReason.SLOW_NODE);
its clean exit opens a node:slow incident that drains the node and swaps in a spare. The
flag comes from the run's own timings, a claim (service/recovery/claims.py): the move is one
of max_restarts, and with none left the node is only flagged. With `flag` it is only shown."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from contract import StopReason
from service.admin.gauges import StateCollector
from service.config import SlowNodePolicy
from service.db import session_scope
from service.models import AttemptState, NodeState, RunEvent, RunState
from service.nodes.stragglers import judge_report
from service.worker_protocol.schemas import ProgressReport
from service.workers import service as workers
from tests.unit.reconcile.conftest import Cluster
from tests.unit.reconcile.test_checkpoint_trust import live_attempt_id, running

FAST, SLOW = 0.010, 0.300  # seconds of update: the slow node at 30x


def report_times(cluster: Cluster, run_id: int, step: int, times: dict[str, float]) -> None:
    """One progress report of rank 0 with the nodes' update times (worker/train.py)."""
    body = ProgressReport(
        rank=0,
        metrics=[{"step": step, "loss": 1.0, "step_time_s": 0.1}],
        node_update_s={"step": step, "update_s": times},
    )
    with session_scope() as session:
        workers.record_progress(session, live_attempt_id(cluster, run_id), body, cluster.settings)


def slow_reports(
    cluster: Cluster, run_id: int, slow: str, fast: str, count: int, first: int
) -> None:
    for i in range(count):
        report_times(cluster, run_id, first + i, {slow: SLOW, fast: FAST})


def test_the_rule_compares_each_node_with_the_median_of_the_others() -> None:
    judged = {j.node: j for j in judge_report({"a": 1.0, "b": 1.1, "c": 1.3, "d": 2.0}, 1.25, 0.0)}
    assert judged["d"].slow and judged["d"].peers_median_s == 1.1  # median of 1.0, 1.1, 1.3
    assert not judged["c"].slow  # 1.3 < 1.25 x median(1.0, 1.1, 2.0) = 1.375
    assert [j.node for j in judged.values() if j.slow] == ["d"]
    # Two nodes: each against the other. The absolute floor keeps jitter out.
    assert [j.slow for j in judge_report({"a": 0.004, "b": 0.009}, 1.25, 0.02)] == [False, False]
    assert [j.slow for j in judge_report({"a": 0.01, "b": 0.05}, 1.25, 0.02)] == [False, True]
    assert judge_report({"alone": 5.0}, 1.25, 0.0) == []  # no peers, no verdict


def test_a_slow_node_is_flagged_after_five_reports_and_the_run_moves_to_a_spare(
    cluster: Cluster,
) -> None:
    cluster.set_spares(1)
    run_id = running(cluster, "straggler")
    slow, fast = cluster.run(run_id).nodes[1], cluster.run(run_id).nodes[0]
    cluster.train(run_id, 20)
    slow_reports(cluster, run_id, slow, fast, 4, first=21)
    assert cluster.node(slow).num_slow_reports == 4 and cluster.node(slow).slow_since is None
    assert cluster.node(fast).num_slow_reports == 0
    slow_reports(cluster, run_id, slow, fast, 1, first=25)  # the fifth: flagged

    node = cluster.node(slow)
    assert node.slow_since is not None and node.slow_ratio == pytest.approx(30.0)
    attempt = cluster.attempts(run_id)[0]
    assert attempt.stop_reason == StopReason.SLOW_NODE and attempt.stop_requested_at
    assert "recovery.slow_node" in cluster.events(run_id)
    gauge = {
        s.labels["node"]: s.value
        for m in StateCollector(session_scope).collect()  # type: ignore[arg-type]
        if m.name == "runyard_node_slow"
        for s in m.samples
    }
    assert gauge[slow] == 1.0 and gauge[fast] == 0.0

    # The ranks checkpoint at their next report and exit 0: a yield, not a failure.
    cluster.train(run_id, 26)
    cluster.slurm.finish(cluster.live_job(run_id), exit_code=0)
    cluster.tick(2)
    run = cluster.run(run_id)
    first = cluster.attempts(run_id)[0]
    assert first.state == AttemptState.STOPPED and first.stop_reason == StopReason.SLOW_NODE
    assert slow not in run.nodes and len(run.nodes) == 2
    assert cluster.node(slow).state == NodeState.DRAINED
    assert cluster.slurm.nodes[slow].drained and "slow" in cluster.slurm.nodes[slow].reason
    [incident] = cluster.incidents(slow)
    assert incident.signal == "node:slow" and incident.spare_node in run.nodes
    assert (run.num_restarts, run.num_hardware_restarts) == (1, 0)  # one of max_restarts
    cluster.slurm.schedule()
    cluster.tick()
    assert cluster.run(run_id).state == RunState.RUNNING
    assert cluster.attempts(run_id)[-1].resume_step == 26


def test_one_report_within_the_margin_resets_the_count(cluster: Cluster) -> None:
    run_id = running(cluster, "jitter")
    a, b = cluster.run(run_id).nodes
    slow_reports(cluster, run_id, b, a, 4, first=1)
    report_times(cluster, run_id, 5, {a: FAST, b: FAST})
    slow_reports(cluster, run_id, b, a, 4, first=6)
    assert cluster.node(b).slow_since is None and cluster.node(b).num_slow_reports == 4


def test_with_the_flag_policy_or_no_spare_the_run_stays(cluster: Cluster) -> None:
    cluster.settings.slow_node_policy = SlowNodePolicy.FLAG
    cluster.set_spares(1)
    flagged = running(cluster, "flag-only")
    a, b = cluster.run(flagged).nodes
    slow_reports(cluster, flagged, b, a, 5, first=1)
    assert cluster.node(b).slow_since is not None
    assert cluster.attempts(flagged)[0].stop_requested_at is None

    cluster.settings.slow_node_policy = SlowNodePolicy.MOVE
    cluster.set_spares(0)
    cluster.tick()
    no_spare = running(cluster, "no-spare")
    c, d = cluster.run(no_spare).nodes
    slow_reports(cluster, no_spare, d, c, 5, first=1)
    assert cluster.node(d).slow_since is not None
    assert cluster.attempts(no_spare)[0].stop_requested_at is None  # waiting costs more
    # Back within the margin: the flag clears.
    report_times(cluster, no_spare, 6, {c: FAST, d: FAST})
    assert cluster.node(d).slow_since is None


def test_a_run_with_no_restarts_left_is_only_flagged(cluster: Cluster) -> None:
    """A slow node is the run's own claim: with max_restarts used up, no move and no drain."""
    cluster.set_spares(1)
    run_id = running(cluster, "no-budget", max_restarts=0)
    a, b = cluster.run(run_id).nodes
    slow_reports(cluster, run_id, b, a, 5, first=1)
    assert cluster.node(b).slow_since is not None
    assert cluster.attempts(run_id)[0].stop_requested_at is None
    with session_scope() as session:
        said = session.scalars(
            select(RunEvent.message).where(
                RunEvent.run_id == run_id, RunEvent.kind == "recovery.slow_node"
            )
        ).all()
    assert said and "not moved: its restarts are used up (max_restarts 0)" in said[-1], said
