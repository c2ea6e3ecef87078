"""The reconciler at 10,240 GPUs: real Postgres, an in-memory Slurm of 1,280 nodes.

200 runs train on 1,200 of the nodes (6 nodes each), the spare pool holds 11 (the planner's
size for 10,240 GPUs at Llama 3's failure rate); then 20 sweeps of 50 one-node points arrive
through the sweeps service (`create_sweep`, each member admitted like a run), each queued by
the reconciler as one Slurm job array (`reconcile/sweeps.py`) of which 3 tasks run at once
on the nodes left; then 10,000 more runs wait in the queue for nodes. We time steady-state
ticks of the real `Reconciler` (each step separately) at each stage, count its Slurm calls
per tick (the fake counts every SlurmClient call), time the ticks that submit the arrays,
that hand the started tasks their nodes, and that follow sweep tasks ending (the next ones
start), then fail one node of a training run and time the tick that drains it and moves its
run to a spare.

    .venv/bin/python bench/reconciler_scale.py [--queued 10000] [--sweeps 20] [--ticks 5]
    .venv/bin/python bench/reconciler_scale.py --smoke   # 32 nodes, 4 runs, 1 sweep: seconds

Only Slurm is simulated (service/slurm/fake.py); the database is a fresh one of its own
(`runyard_scale`; the smoke's is named after its process and dropped at the end), migrated
by Alembic. Runs and sweeps are submitted by a user linked to a Unix user, as every
submitter must be (service/identity/); the in-memory Slurm runs nothing as them. The last
line is one JSON object with the figures, the targets (tick < 1 s, placement < 100 ms,
Slurm calls per tick bounded: the same without sweeps, with them, and with 10,000 queued
runs besides) and "target_met".
"""

from __future__ import annotations

import argparse
import dataclasses
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
from sqlalchemy import func, select  # noqa: E402

from client.devcluster import postgres  # noqa: E402
from service.auth.principal import Principal  # noqa: E402
from service.config import Settings, get_settings  # noqa: E402
from service.db import get_engine, session_scope  # noqa: E402
from service.identity.owner_folders import checkpoint_folder  # noqa: E402
from service.models import Role, Run, RunState, UserLink  # noqa: E402
from service.reconcile import loop  # noqa: E402
from service.reconcile.loop import Reconciler  # noqa: E402
from service.recovery import spares  # noqa: E402
from service.recovery.classification import Classifier  # noqa: E402
from service.recovery.signals import SignalIn, ingest_node_events  # noqa: E402
from service.runs import repository  # noqa: E402
from service.runs.schemas import RunSpec  # noqa: E402
from service.runs.service import create_run  # noqa: E402
from service.slurm.fake import FakeSlurm  # noqa: E402
from service.sweeps.schemas import SweepSpec  # noqa: E402
from service.sweeps.service import create_sweep  # noqa: E402
from service.worker_protocol.schemas import CheckpointReport, FinishReport  # noqa: E402
from service.workers import service as workers  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Scale:
    """The cluster and its load."""

    num_switches: int
    nodes_per_switch: int
    runs: int  # training runs, each on run_nodes
    run_nodes: int
    spares: int
    sweep_points: int  # one-node runs per sweep (an even number: lr x 2 seeds)
    sweep_parallel: int  # of a sweep's runs at once
    tasks_ending: int  # sweep tasks that end together in the churn tick


# 1,280 nodes of 8 GPUs (10,240 GPUs); 11 spares: planner.reliability.assess for 10,240 GPUs
# at Llama 3's rate; sweeps of 50 one-node runs, 3 at once.
FULL = Scale(
    80, 16, runs=200, run_nodes=6, spares=11, sweep_points=50, sweep_parallel=3, tasks_ending=10
)
# The same steps at the smallest size that still has runs, spares and sweep tasks to move.
SMOKE = Scale(
    2, 16, runs=4, run_nodes=6, spares=2, sweep_points=4, sweep_parallel=2, tasks_ending=2
)
# Who submits: a user linked to a Unix user, as tests/unit/reconcile/conftest.py links its
# owner (the in-memory Slurm runs nothing, so the Unix user need not exist here).
OWNER = Principal(token_id=0, user="bench", team="ml", role=Role.USER)
OWNER_UNIX_USER = "bench"
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
        (submission, "submit_group_attempts"),
        (loop.ended_jobs, "cancel_jobs_of_ended_attempts"),
    ]:
        clock.wrap(module, name, name)
    clock.wrap(Reconciler, "sync_nodes", "sync_nodes")
    return clock


def link_owner() -> None:
    """OWNER's link to its Unix user, as `runyard admin user link` writes it."""
    with session_scope() as session:
        session.add(UserLink(user=OWNER.user, unix_user=OWNER_UNIX_USER, linked_by="bench"))


def sweep_spec(index: int, scale: Scale) -> SweepSpec:
    """A learning-rate sweep of one-node runs (x seed, to reach scale.sweep_points points)."""
    lrs = [round(1e-4 * (k + 1), 6) for k in range(scale.sweep_points // 2)]
    return SweepSpec.model_validate(
        {
            "name": f"sweep-{index}",
            "model": "tiny",
            "nodes": 1,
            "gpus_per_node": 8,
            "seq_len": 128,
            "global_batch": 64,
            "steps": 10_000,
            "sweep": {
                "grid": {"lr": lrs, "seed": [0, 1]},
                "max_parallel": scale.sweep_parallel,
            },
        }
    )


def add_sweeps(count: int, settings: Settings, scale: Scale) -> float:
    """`count` sweeps through the sweeps service, as POST /sweeps creates them; the median
    seconds one create_sweep took (its members each planned and admitted)."""
    took = []
    for i in range(count):
        started = time.perf_counter()
        with session_scope() as session:
            create_sweep(session, sweep_spec(i, scale), settings, OWNER)
        took.append(time.perf_counter() - started)
    return statistics.median(took) if took else 0.0


def steady_calls(fig: dict[str, Any]) -> int:
    """Slurm calls of a steady tick, less the topology's timed re-read."""
    return int(fig["slurm_calls_total"]) - int(fig["slurm_calls"].get("topology", 0))


def finish_task(attempt_id: int, settings: Settings) -> None:
    """What a sweep task's trainer reports at its end: the final checkpoint, the final step."""
    with session_scope() as session:
        _, run = workers.live_attempt_and_run(session, attempt_id)
        steps = run.total_steps
        # Inside the run's own folder: the service refuses a checkpoint anywhere else.
        path = str(checkpoint_folder(settings, run) / f"step_{steps:08d}")
    with session_scope() as session:
        report = CheckpointReport(step=steps, path=path, state="COMMITTED")
        workers.record_checkpoint(session, attempt_id, report, settings)
    with session_scope() as session:
        workers.record_finish(session, attempt_id, FinishReport(final_step=steps))


def one_tick(reconciler: Reconciler, slurm: FakeSlurm) -> dict[str, Any]:
    """One tick that does something (not steady state): its time and Slurm calls."""
    fig = tick_figures(reconciler, slurm, 1)
    return {k: fig[k] for k in ("tick_s", "slurm_calls", "slurm_calls_total", "steps_s")}


def sweep_counts() -> dict[str, int]:
    """Sweep members by state."""
    with session_scope() as session:
        rows = session.execute(
            select(Run.state, func.count()).where(Run.sweep_id.is_not(None)).group_by(Run.state)
        )
        return {state.value: n for state, n in rows}


def queue_runs(count: int) -> None:
    """`count` more runs waiting for nodes, as create_run stores them: one through the
    service, the rest copied from it in one INSERT (the planner need not run 10,000 times)."""
    if count <= 0:
        return
    with session_scope() as session:
        template = create_run(session, spec("queued", 8), Settings(), OWNER).id
    with psycopg.connect(get_settings().database_url.replace("+psycopg", "")) as conn:
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
    parser.add_argument("--sweeps", type=int, default=20)
    parser.add_argument("--ticks", type=int, default=5)
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="32 nodes, 4 runs, 1 sweep of 4, 10 queued, 1 tick: the same steps in seconds",
    )
    args = parser.parse_args()
    scale = SMOKE if args.smoke else FULL
    database_url = DATABASE_URL
    if args.smoke:  # a database of its own: smokes of several test sessions may overlap
        args.queued, args.sweeps, args.ticks = 10, 1, 1
        database_url = DATABASE_URL.replace("runyard_scale", f"runyard_scale_smoke_{os.getpid()}")
        os.environ["RUNYARD_DATABASE_URL"] = database_url  # read at the first session
    postgres.ensure_running()
    postgres.fresh_database(database_url)
    try:
        measure(args, scale)
    finally:
        if args.smoke:
            get_engine().dispose()
            postgres.drop_database(database_url)


def measure(args: argparse.Namespace, scale: Scale) -> None:
    state = Path(tempfile.mkdtemp(prefix="runyard-scale-"))
    settings = Settings(state_dir=state, job_prefix="scale", run_reconciler=False)
    slurm = FakeSlurm.cluster(
        num_switches=scale.num_switches, nodes_per_switch=scale.nodes_per_switch
    )
    reconciler = Reconciler(settings, slurm)
    reconciler.tick()  # the nodes, from Slurm
    link_owner()
    with session_scope() as session:
        spares.set_target(session, slurm.cluster_name, scale.spares)
        ids = [
            create_run(session, spec(f"train-{i}", scale.run_nodes), settings, OWNER).id
            for i in range(scale.runs)
        ]
    reconciler.tick()
    slurm.schedule()
    reconciler.tick()
    with session_scope() as session:
        running = len(repository.runs_in_states(session, [RunState.RUNNING]))
    print(
        f"{len(slurm.nodes)} nodes, {running} of {scale.runs} runs running, {scale.spares} spares"
    )

    small = tick_figures(reconciler, slurm, args.ticks)

    # Sweeps: created through the service, queued as job arrays, a few tasks running.
    create_s = add_sweeps(args.sweeps, settings, scale)
    arrays = one_tick(reconciler, slurm)  # one sbatch --array per sweep
    slurm.schedule()  # Slurm starts what the free nodes and each array's limit allow
    started = one_tick(reconciler, slurm)  # the tasks' runs take the nodes Slurm gave them
    counts = sweep_counts()
    print(
        f"{args.sweeps} sweeps of {scale.sweep_points} points (at most "
        f"{scale.sweep_parallel} at once): "
        f"create_sweep {create_s * 1000:.0f} ms each (median); arrays submitted in one tick "
        f"of {arrays['tick_s'] * 1000:.0f} ms, {arrays['slurm_calls_total']} Slurm calls "
        f"{arrays['slurm_calls']}; tasks started: tick {started['tick_s'] * 1000:.0f} ms, "
        f"{started['slurm_calls_total']} Slurm calls {started['slurm_calls']}; members {counts}"
    )
    swept = tick_figures(reconciler, slurm, args.ticks)
    # Sweep tasks finish (each trainer reports its final checkpoint and step through the
    # workers service, then exits 0): the next tasks of those arrays start.
    running_tasks = [j for j in slurm.jobs.values() if j.array_id and j.state == "RUNNING"]
    running_tasks = running_tasks[: scale.tasks_ending]
    for job in running_tasks:
        finish_task(job.attempt_id, settings)
        slurm.finish(job.job_id, exit_code=0)
    ended = one_tick(reconciler, slurm)
    slurm.schedule()
    churn = one_tick(reconciler, slurm)
    print(
        f"{len(running_tasks)} sweep tasks finish: tick {ended['tick_s'] * 1000:.0f} ms, "
        f"{ended['slurm_calls_total']} Slurm calls {ended['slurm_calls']}; the next "
        f"{len(running_tasks)} start: tick {churn['tick_s'] * 1000:.0f} ms, "
        f"{churn['slurm_calls_total']} Slurm calls {churn['slurm_calls']}; "
        f"members {sweep_counts()}"
    )

    queue_runs(args.queued)
    reconciler.tick()  # the queued runs say once what they wait for
    big = tick_figures(reconciler, slurm, args.ticks)
    for label, fig in (
        (f"{running} running", small),
        (f"+ {args.sweeps} sweeps", swept),
        (f"+ {args.queued:,} queued", big),
    ):
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
        ingest_node_events(session, slurm.cluster_name, victim, [event], settings, Classifier())
    recovery = tick_figures(reconciler, slurm, 1)
    with session_scope() as session:
        moved = repository.get_run(session, ids[0])
        assert moved is not None
        replaced = victim not in moved.nodes and len(moved.nodes) == scale.run_nodes
    print(
        f"recovery tick (drain {victim}, move run {ids[0]} to a spare): "
        f"{recovery['tick_s'] * 1000:.0f} ms, {recovery['slurm_calls_total']} Slurm calls; "
        f"moved: {replaced}"
    )
    placement_s = max(fig["steps_s"].get("place_pending", 0.0) for fig in (small, swept, big))
    # The topology (SlurmClient.topology) is re-read on a timer (loop.TOPOLOGY_EVERY_S), whichever
    # tick that falls on: left out of the comparison.
    bounded = steady_calls(small) == steady_calls(swept) == steady_calls(big)
    print(
        json.dumps(
            {
                "bench": "reconciler_scale",
                "nodes": len(slurm.nodes),
                "runs_running": running,
                "runs_queued": args.queued,
                "sweeps": args.sweeps,
                "smoke": scale == SMOKE,
                "sweep_points": scale.sweep_points,
                "sweep_max_parallel": scale.sweep_parallel,
                "sweep_members": sweep_counts(),
                "create_sweep_s": create_s,
                "small": small,
                "with_sweeps": swept,
                "big": big,
                "sweep_arrays_tick": arrays,
                "sweep_tasks_started_tick": started,
                "sweep_tasks_ended_tick": ended,
                "sweep_next_tasks_tick": churn,
                "recovery": recovery,
                "recovered_onto_spare": replaced,
                "targets": {
                    "tick_s": TARGET_TICK_S,
                    "placement_s": TARGET_PLACEMENT_S,
                    "slurm_calls_per_tick": "the same without sweeps, with them, and with "
                    f"{args.queued:,} queued",
                },
                "target_met": big["tick_s"] < TARGET_TICK_S
                and swept["tick_s"] < TARGET_TICK_S
                and recovery["tick_s"] < TARGET_TICK_S
                and placement_s < TARGET_PLACEMENT_S
                and bounded
                and replaced,
            }
        )
    )


if __name__ == "__main__":
    main()
