"""The reconciler at 10,240 GPUs: real Postgres, an in-memory Slurm of 1,280 nodes.

200 runs train on 1,200 of the nodes (6 nodes each), the spare pool holds 11 (the planner's
size for 10,240 GPUs at Llama 3's failure rate), and 10,000 more runs wait in the queue
for nodes. We time steady-state ticks of the real `Reconciler` (each step separately),
count its Slurm calls per tick (the fake counts every SlurmClient call), then fail one node
of a training run and time the tick that drains it and moves its run to a spare.

    .venv/bin/python bench/reconciler_scale.py [--queued 10000] [--ticks 5]

Only Slurm is simulated (service/slurm/fake.py); the database is a fresh one of its own
(`runyard_scale`), migrated by Alembic. The last line is one JSON object with the figures,
the targets (tick < 1 s, placement < 100 ms, Slurm calls per tick bounded: the same with
10 queued runs as with 10,000) and "target_met".
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/runyard_scale"
os.environ["RUNYARD_DATABASE_URL"] = DATABASE_URL

import psycopg  # noqa: E402

from client.devcluster import postgres  # noqa: E402
from service.config import Settings  # noqa: E402
from service.db import session_scope  # noqa: E402
from service.models import RunState  # noqa: E402
from service.reconcile import loop  # noqa: E402
from service.reconcile.loop import Reconciler  # noqa: E402
from service.recovery import spares  # noqa: E402
from service.recovery.classification import Classifier  # noqa: E402
from service.recovery.signals import SignalIn, ingest_node_events  # noqa: E402
from service.runs import repository  # noqa: E402
from service.runs.schemas import RunSpec  # noqa: E402
from service.runs.service import create_run  # noqa: E402
from service.slurm.fake import FakeSlurm  # noqa: E402

NUM_SWITCHES, NODES_PER_SWITCH = 80, 16  # 1,280 nodes of 8 GPUs: 10,240 GPUs
RUNS, RUN_NODES = 200, 6
SPARES = 11  # planner.reliability.assess for 10,240 GPUs at Llama 3's rate
TARGET_TICK_S = 1.0
TARGET_PLACEMENT_S = 0.100
XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."
STEPS = [name for name in dir(loop) if not name.startswith("_")]


def spec(name: str, nodes: int) -> RunSpec:
    return RunSpec.model_validate(
        {
            "name": name,
            "model": "tiny",
            "nodes": nodes,
            "gpus_per_node": 8,
            "seq_len": 128,
            "global_batch": 8 * 8 * nodes,
            "steps": 100_000,
            "checkpoint_every": 100,
            "max_restarts": 3,
        }
    )


class StepClock:
    """Wall time of each reconcile step, by wrapping the functions loop.py calls."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def wrap(self, module: Any, name: str, label: str) -> None:
        inner: Callable[..., Any] = getattr(module, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.seconds[label] = self.seconds.get(label, 0.0) + time.perf_counter() - started

        setattr(module, name, timed)


CLOCK = StepClock()


def clock_steps() -> StepClock:
    """Wrap the steps once (a second wrap would count each step twice)."""
    from service.reconcile import cancellation, placement, polling, preemption, submission, sweeps

    if CLOCK.seconds or getattr(loop, "_clocked", False):
        return CLOCK
    loop._clocked = True  # type: ignore[attr-defined]
    clock = CLOCK
    for name in ("process_incidents", "check_nodes", "check_hangs", "maintain_spares"):
        clock.wrap(loop, name, name)
    for module, name in [
        (placement, "place_pending"),
        (placement, "release_ended_runs"),
        (preemption, "preempt_for_waiting_runs"),
        (preemption, "stop_segments_at_time_limit"),
        (preemption, "enforce_stop_deadlines"),
        (preemption, "sync_run_reservations"),
        (submission, "submit_pending"),
        (sweeps, "submit_sweeps"),
        (sweeps, "hold_array_nodes"),
        (cancellation, "stop_cancelling"),
        (polling, "poll_attempts"),
        (loop.lighthouse, "maintain_lighthouses"),
        (loop.fast_path, "submit_group_attempts"),
        (loop.fast_path, "cancel_ended_group_jobs"),
    ]:
        clock.wrap(module, name, name)
    clock.wrap(Reconciler, "sync_nodes", "sync_nodes")
    return clock


def queue_runs(count: int) -> None:
    """`count` more runs waiting for nodes, as create_run stores them: one through the
    service, the rest copied from it in one INSERT (the planner need not run 10,000 times)."""
    if count <= 0:
        return
    with session_scope() as session:
        template = create_run(session, spec("queued", 8), Settings()).id
    with psycopg.connect(DATABASE_URL.replace("+psycopg", "")) as conn:
        columns = [
            r[0]
            for r in conn.execute(
                "SELECT column_name FROM information_schema.columns "
                "WHERE table_name = 'runs' AND column_name NOT IN ('id', 'name')"
            )
        ]
        cols = ", ".join(f'"{c}"' for c in columns)
        conn.execute(
            f"INSERT INTO runs (name, {cols}) SELECT 'queued-' || i, {cols} "
            "FROM runs, generate_series(2, %s) AS i WHERE runs.id = %s",
            (count, template),
        )


def tick_figures(reconciler: Reconciler, slurm: FakeSlurm, ticks: int) -> dict[str, Any]:
    clock = clock_steps()
    walls, calls = [], []
    for _ in range(ticks):
        slurm.calls.clear()
        clock.seconds.clear()
        started = time.perf_counter()
        reconciler.tick()
        walls.append(time.perf_counter() - started)
        calls.append(dict(slurm.calls))
    return {
        "tick_s": statistics.median(walls),
        "tick_max_s": max(walls),
        "slurm_calls": calls[-1],
        "slurm_calls_total": sum(calls[-1].values()),
        "steps_s": {
            k: round(v, 4) for k, v in sorted(clock.seconds.items(), key=lambda kv: -kv[1])
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--queued", type=int, default=10_000)
    parser.add_argument("--ticks", type=int, default=5)
    args = parser.parse_args()
    postgres.ensure_running()
    postgres.fresh_database(DATABASE_URL)
    state = Path(tempfile.mkdtemp(prefix="runyard-scale-"))
    settings = Settings(state_dir=state, job_prefix="scale", run_reconciler=False)
    slurm = FakeSlurm.cluster(num_switches=NUM_SWITCHES, nodes_per_switch=NODES_PER_SWITCH)
    reconciler = Reconciler(settings, slurm)
    reconciler.tick()  # the nodes, from Slurm
    with session_scope() as session:
        spares.set_target(session, SPARES)
        ids = [create_run(session, spec(f"train-{i}", RUN_NODES), settings).id for i in range(RUNS)]
    reconciler.tick()
    slurm.schedule()
    reconciler.tick()
    with session_scope() as session:
        running = len(repository.runs_in_states(session, [RunState.RUNNING]))
    print(f"{len(slurm.nodes)} nodes, {running} of {RUNS} runs running, {SPARES} spares")

    small = tick_figures(reconciler, slurm, args.ticks)
    queue_runs(args.queued)
    reconciler.tick()  # the queued runs say once what they wait for
    big = tick_figures(reconciler, slurm, args.ticks)
    for label, fig in (("10 queued", small), (f"{args.queued:,} queued", big)):
        print(
            f"{label}: tick {fig['tick_s'] * 1000:.0f} ms (max {fig['tick_max_s'] * 1000:.0f}), "
            f"{fig['slurm_calls_total']} Slurm calls {fig['slurm_calls']}"
        )
        print(
            "  steps (ms): " + ", ".join(f"{k} {v * 1000:.0f}" for k, v in fig["steps_s"].items())
        )

    # A node of a training run fails: the tick that drains it and moves the run.
    with session_scope() as session:
        victim_run = repository.get_run(session, ids[0])
        assert victim_run is not None
        victim = victim_run.nodes[-1]
        event = SignalIn(f"{victim}-xid-79", "xid", 79, XID_79, None, {})
        ingest_node_events(session, victim, [event], settings, Classifier())
    recovery = tick_figures(reconciler, slurm, 1)
    with session_scope() as session:
        moved = repository.get_run(session, ids[0])
        assert moved is not None
        replaced = victim not in moved.nodes and len(moved.nodes) == RUN_NODES
    print(
        f"recovery tick (drain {victim}, move run {ids[0]} to a spare): "
        f"{recovery['tick_s'] * 1000:.0f} ms, {recovery['slurm_calls_total']} Slurm calls; "
        f"moved: {replaced}"
    )
    placement_s = big["steps_s"].get("place_pending", 0.0)
    bounded = small["slurm_calls_total"] == big["slurm_calls_total"]
    print(
        json.dumps(
            {
                "bench": "reconciler_scale",
                "nodes": len(slurm.nodes),
                "runs_running": running,
                "runs_queued": args.queued,
                "small": small,
                "big": big,
                "recovery": recovery,
                "recovered_onto_spare": replaced,
                "targets": {
                    "tick_s": TARGET_TICK_S,
                    "placement_s": TARGET_PLACEMENT_S,
                    "slurm_calls_per_tick": "the same with 10 or 10,000 queued",
                },
                "target_met": big["tick_s"] < TARGET_TICK_S
                and recovery["tick_s"] < TARGET_TICK_S
                and placement_s < TARGET_PLACEMENT_S
                and bounded
                and replaced,
            }
        )
    )


if __name__ == "__main__":
    main()
