"""Slow nodes under the `move` policy: off the node at a checkpoint, onto a spare.

When a node of a running run is flagged SLOW (service/nodes/stragglers.py) and the policy
(Settings.slow_node_policy) is `move`, the service asks the run's ranks to stop
(StopReason.SLOW_NODE): they checkpoint at their next report and exit 0, as for a
preemption, so no step is lost. When the job has ended, `after_yield` opens a
`node:slow` incident for each flagged node of the run; the incident drains it in Slurm and
swaps in a spare (recovery/move_to_spare.py), as for a failed node. The flag comes from the
run's own timings, a claim (recovery/claims.py): a move is one of the run's max_restarts and
one of its capped report-caused drains; with either used up the node is only flagged.

A move needs a free spare: without one the run would wait for a node instead of training
slowly, which costs more, so it stays where it is (the node stays flagged and alerting).
Replica-group runs are only flagged: their groups stop on their own (not handled here).
"""

from __future__ import annotations

from collections.abc import Callable

from sqlalchemy.orm import Session

from contract import StopReason
from service.config import Settings, SlowNodePolicy, get_settings
from service.models import Attempt, AttemptState, Node, Run
from service.nodes import repository as nodes_repo
from service.nodes.stragglers import Judged
from service.recovery import claims
from service.recovery.spares import spare_nodes
from service.runs.run_state_machine import record_event
from service.runs.stop_requests import request_stop

SIGNAL = claims.SLOW_SIGNAL  # the incidents' signal, and the alert's label


def on_flagged(
    session: Session, run: Run, attempt: Attempt, settings: Settings, step: int
) -> Callable[[Node, Judged], None]:
    """What to do with a node flagged in `run`'s report up to `step`: a callback for
    service/nodes/stragglers.py."""

    def act(node: Node, judged: Judged) -> None:
        text = (
            f"node {node.name} is SLOW at step {step}: {judged.ratio:.2f}x its peers' median "
            f"update time for {node.num_slow_reports} reports"
        )
        data = {
            "node": node.name,
            "ratio": judged.ratio,
            "step": step,
            "policy": settings.slow_node_policy.value,
        }
        move = False
        if settings.slow_node_policy == SlowNodePolicy.FLAG:
            outcome = " (policy flag)"
        elif why_not := _cannot_move(session, run, attempt, settings):
            outcome = f"; not moved: {why_not}"
        else:
            outcome, move = "; moving to a spare: checkpoint at the next report, then resume", True
        record_event(session, run, "recovery.slow_node", text + outcome, attempt, data)
        if move:
            request_stop(session, run, attempt, StopReason.SLOW_NODE)

    return act


def _cannot_move(session: Session, run: Run, attempt: Attempt, settings: Settings) -> str | None:
    if attempt.state != AttemptState.RUNNING or attempt.stop_requested_at is not None:
        return "the attempt is already stopping"
    if run.config.get("fault_tolerance"):  # split into replica groups (as planned)
        return "replica-group runs are only flagged"
    # The run's own timings flagged the node: a claim (recovery/claims.py), so a move is
    # one of its restarts and one of its capped report-caused drains.
    if run.num_restarts - run.num_hardware_restarts >= run.max_restarts:
        return f"its restarts are used up (max_restarts {run.max_restarts})"
    if claims.drains_left(session, run, settings) == 0:
        return f"its reports already caused {settings.report_drains_per_run} drains lately"
    if not spare_nodes(session, run.cluster):
        return "no spare free (waiting for one would cost more than training slowly)"
    return None


def after_yield(session: Session, run: Run, attempt: Attempt) -> list[str]:
    """The attempt stopped for SLOW_NODE: open a drain-and-move incident for each of the
    run's nodes still flagged SLOW. Returns their names (none if the flag cleared since:
    the run then resumes where it was)."""
    slow = [
        n for n in nodes_repo.get_nodes(session, run.cluster, run.nodes) if n.slow_since is not None
    ]
    settings = get_settings()
    moved = [
        node.name
        for node in slow
        if claims.drain_claimed(
            session,
            run,
            settings,
            kind="slow_node",
            signal=SIGNAL,
            node=node.name,
            attempt_id=attempt.id,
            message=f"{node.name}: slow ({node.slow_ratio or 0:.2f}x its peers' median "
            f"update time in run {run.id}); drained, run moved to a spare",
        )
    ]
    if moved:  # a move the run's own reports asked for: one of its max_restarts
        run.num_restarts += 1
    return moved
