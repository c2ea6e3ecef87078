"""Issue 37: a node drained only because its agent fell silent returns by itself once the
agent has heartbeated for heartbeat_return_s, and stays drained when anything else holds it:
a fault its agent reports, an admin's drain, a Slurm drain that is not runyard's.

Time passes without waiting: everything recorded of the node moves back by the seconds that
pass, while its agent beats through them at its period (as age_attempt in conftest.py moves
an attempt's stamps back)."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta

import pytest
from sqlalchemy import select, update

from service.admin import service as admin
from service.config import Settings
from service.db import session_scope
from service.models import Incident, IncidentState, NodeEvent, NodeState
from service.models.base import utcnow
from service.nodes import service as nodes
from service.recovery.health import HEARTBEAT_LOST
from tests.unit.reconcile.conftest import Cluster

RETURN_S = 60.0  # heartbeat_return_s for these tests (the default is 600 s)
AGENT_PERIOD_S = 2.0  # the agent's heartbeat period (worker/agent/main.py --interval-s)
RETURNED = "heartbeats back for {:.0f} s: heartbeat-only drain returned"


def returned_after(node: str) -> list[float]:
    """How long the heartbeats had been back, as each node.healthy event of `node` says.
    The tests shift time by whole seconds, but real time passes between the shifts too (a
    second or two on a loaded machine): 65 s shifted reads 65 or 66."""
    pattern = re.compile(RETURNED.replace("{:.0f}", r"(\d+)"))
    return [
        float(found.group(1))
        for kind, message in node_events(node)
        if kind == "node.healthy" and (found := pattern.fullmatch(message))
    ]


def beat(cluster: Cluster, node: str) -> None:
    """The node's agent heartbeats now, as POST /v1/nodes/{node}/heartbeat records it."""
    with session_scope() as session:
        nodes.touch_heartbeats(session, "default", [node], cluster.settings)


def time_passes(cluster: Cluster, node: str, seconds: float, *, beating: bool) -> None:
    """`seconds` go by: the node's heartbeats, events and incidents move that far back, and
    its agent, if `beating`, heartbeats every AGENT_PERIOD_S through them."""
    shift = timedelta(seconds=seconds)
    with session_scope() as session:
        session.execute(
            update(NodeEvent)
            .where(NodeEvent.node_name == node)
            .values(created_at=NodeEvent.created_at - shift)
        )
        stamps = ("signal_at", "detected_at", "drained_at", "attempt_ended_at", "resolved_at")
        session.execute(
            update(Incident)
            .where(Incident.node_name == node)
            .values({s: getattr(Incident, s) - shift for s in stamps})
        )
        row = nodes.require_node(session, "default", node, for_update=True)
        assert row.last_heartbeat_at is not None
        row.last_heartbeat_at -= shift
        if row.heartbeats_since is not None:
            row.heartbeats_since -= shift
        last = row.last_heartbeat_at
    if not beating:
        return
    now, period = utcnow(), timedelta(seconds=AGENT_PERIOD_S)
    at = last + period
    with session_scope() as session:
        while at < now:
            nodes.touch_heartbeats(session, "default", [node], cluster.settings, now=at)
            at += period
    beat(cluster, node)


@pytest.fixture
def returning(cluster: Cluster, settings: Settings) -> Cluster:
    """The cluster with heartbeat_return_s at RETURN_S, a spare, and a reconciler that has
    watched for an hour (silence counts from no earlier than its watch)."""
    cluster.reconciler.settings = cluster.settings = settings.model_copy(
        update={"heartbeat_return_s": RETURN_S}
    )
    cluster.reconciler.watching_since = utcnow() - timedelta(hours=1)
    cluster.set_spares(1)
    return cluster


def running_node(cluster: Cluster) -> tuple[int, str]:
    """A run that trained to step 20, and its first node, whose agent heartbeats."""
    run_id = cluster.submit_run("silent")
    cluster.cycle()
    cluster.train(run_id, 20)
    node = cluster.run(run_id).nodes[0]
    beat(cluster, node)
    return run_id, node


def silence_drains(cluster: Cluster, run_id: int, node: str) -> None:
    """The agent falls silent past heartbeat_dead_s (20 s): the first tick opens the
    incident, the second drains the node and moves the run (as today)."""
    time_passes(cluster, node, 30, beating=False)
    cluster.tick()
    (incident,) = cluster.incidents(node)
    assert incident.signal == HEARTBEAT_LOST
    cluster.tick()
    assert_drained(cluster, node)
    assert node not in cluster.run(run_id).nodes


def assert_drained(cluster: Cluster, node: str) -> None:
    assert cluster.node(node).state == NodeState.DRAINED
    assert cluster.slurm.nodes[node].drained


def node_events(node: str) -> list[tuple[str, str]]:
    with session_scope() as session:
        rows = session.execute(
            select(NodeEvent.kind, NodeEvent.message)
            .where(NodeEvent.node_name == node)
            .order_by(NodeEvent.id)
        )
        return [(kind, message) for kind, message in rows]


def test_a_heartbeat_only_drain_returns_once_the_agent_has_beaten_long_enough(
    returning: Cluster,
) -> None:
    cluster = returning
    run_id, node = running_node(cluster)
    silence_drains(cluster, run_id, node)

    beat(cluster, node)  # the agent restarted
    time_passes(cluster, node, RETURN_S - 10, beating=True)
    cluster.tick()
    assert_drained(cluster, node)  # 50 s of heartbeats: too soon

    time_passes(cluster, node, 15, beating=True)
    cluster.tick()
    assert cluster.node(node).state in (NodeState.HEALTHY, NodeState.SPARE)
    assert not cluster.slurm.nodes[node].drained and cluster.slurm.nodes[node].reason == ""
    assert [round(s) for s in returned_after(node)] in ([65], [66], [67]), node_events(node)


def xid_while_drained(cluster: Cluster, node: str) -> None:
    cluster.xid(node)  # its incident still open, the heartbeat one opens no other


def admin_drain(cluster: Cluster, node: str) -> None:
    with session_scope() as session:
        admin.request_drain(session, "default", node, "flapping, RMA")


def slurm_drain_by_someone_else(cluster: Cluster, node: str) -> None:
    cluster.slurm.nodes[node].reason = "cable swap, ask facilities"  # `scontrol update` by hand


@pytest.mark.parametrize(
    ("cause", "before_the_drain"),
    [
        (xid_while_drained, False),
        (admin_drain, False),
        # Between the verdict and the drain: the admin's drain merges into the open incident.
        (admin_drain, True),
        (slurm_drain_by_someone_else, False),
    ],
    ids=["xid", "admin-drain-after", "admin-drain-before", "foreign-slurm-drain"],
)
def test_a_drain_with_another_cause_stays(
    returning: Cluster, cause: Callable[[Cluster, str], None], before_the_drain: bool
) -> None:
    cluster = returning
    _, node = running_node(cluster)
    time_passes(cluster, node, 30, beating=False)
    cluster.tick()
    if before_the_drain:
        cause(cluster, node)
    cluster.tick()
    assert_drained(cluster, node)
    if not before_the_drain:
        cause(cluster, node)
    (incident,) = cluster.incidents(node)  # the heartbeat incident alone: no other opened
    assert incident.signal == HEARTBEAT_LOST and incident.state == IncidentState.OPEN

    beat(cluster, node)
    time_passes(cluster, node, RETURN_S * 3, beating=True)
    cluster.tick(2)
    assert_drained(cluster, node)
    assert not any(kind == "node.healthy" for kind, _ in node_events(node))


def test_heartbeats_that_stop_again_restart_the_count(returning: Cluster) -> None:
    cluster = returning
    run_id, node = running_node(cluster)
    silence_drains(cluster, run_id, node)

    beat(cluster, node)
    time_passes(cluster, node, RETURN_S - 10, beating=True)
    time_passes(cluster, node, 15, beating=False)  # silent past heartbeat_suspect_s (10 s)
    cluster.tick()
    assert_drained(cluster, node)  # back 65 s ago, but silent now

    beat(cluster, node)  # a new streak starts here
    time_passes(cluster, node, RETURN_S - 30, beating=True)
    cluster.tick()
    assert_drained(cluster, node)  # 95 s since it first came back, 30 s since the gap

    time_passes(cluster, node, 35, beating=True)
    cluster.tick()
    assert [round(s) for s in returned_after(node)] in ([65], [66], [67]), node_events(node)


def test_with_heartbeat_return_s_0_it_waits_for_an_admin(
    returning: Cluster, settings: Settings
) -> None:
    cluster = returning
    cluster.reconciler.settings = settings.model_copy(update={"heartbeat_return_s": 0.0})
    run_id, node = running_node(cluster)
    silence_drains(cluster, run_id, node)

    beat(cluster, node)
    time_passes(cluster, node, RETURN_S * 3, beating=True)
    cluster.tick()
    assert_drained(cluster, node)
