"""The dev cluster's real Slurm at N nodes, driven by the real reconciler.

    .venv/bin/python bench/devcluster_scale.py --nodes 512 [--running 48] [--queued 40]

A second Slurm cluster beside the shared dev cluster, so nobody's tests lose theirs: its
own name (runyard-scale), state folder, controller port (26817) and slurmd ports (27001
on), no accounting, the machine's munged; rendered by the dev cluster's own templates
(client/devcluster/render.py), leaf switches of 16 nodes. slurmctld and one slurmd per node
run as `runyard dev up` starts them. The agents are not started: the figure that bounds
them is their memory (below), and bench/control_plane.py --nodes simulates 1,280 of them.

On a fresh database (`runyard_devscale`) the real `Reconciler` ticks in this process with
the CLI SlurmClient (sbatch through submitit, squeue, scontrol): `--running` runs of 2
nodes train, `--queued` runs one node larger than what is left free wait (as in a full
cluster), the spare pool holds `--spares`. Each job runs a sleeper in place of the trainer
(settings.worker_python: 8 tasks per node, as for 8 GPUs), so the nodes carry real
allocations, job steps and reservations without 2 cores training.
Measured: seconds until all N slurmd are idle, the memory of slurmctld and of the slurmd
daemons, steady reconcile ticks (each step clocked) and their Slurm calls, the placement
step, reservation create and update (the CLI client's calls, timed), and a recovery: Xid 79
on a running run's node, the tick that drains and resubmits it, and the seconds until its
next job runs in Slurm. Everything it started is stopped at the end, by pid: the jobs'
tasks, then scancel, the daemons, and the job steps a stopped slurmd leaves behind. The
last line is one JSON object with "target_met" (every started run running, the failed
node's run moved and running again within 10 ticks).

    .venv/bin/python bench/devcluster_scale.py --smoke   # starts nothing: the pure parts

--smoke starts no daemon and touches no database: it renders one leaf's config as the run
would, and computes the figures' verdict and JSON line from made-up figures in measure()'s
shape (SMOKE_FIGURES).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))
DATABASE_URL = "postgresql+psycopg://postgres@127.0.0.1:5432/runyard_devscale"
os.environ["RUNYARD_DATABASE_URL"] = DATABASE_URL

from client.devcluster import postgres  # noqa: E402
from client.devcluster.render import ClusterShape, one_box, render  # noqa: E402
from service.clusters.registry import default_cluster  # noqa: E402
from service.config import Settings  # noqa: E402
from service.db import session_scope  # noqa: E402
from service.identity.gate import OwnerGate  # noqa: E402
from service.models import AttemptState, RunState  # noqa: E402
from service.reconcile import placement  # noqa: E402
from service.reconcile.loop import Reconciler  # noqa: E402
from service.recovery import spares  # noqa: E402
from service.recovery.classification import Classifier  # noqa: E402
from service.recovery.signals import SignalIn, ingest_node_events  # noqa: E402
from service.runs import repository  # noqa: E402
from service.runs.schemas import RunSpec  # noqa: E402
from service.runs.service import create_run  # noqa: E402
from service.slurm.cli import CliSlurmClient  # noqa: E402

CLUSTER_NAME = "runyard-scale"
CONTROLLER_PORT = 26817
FIRST_SLURMD_PORT = 27001
LEAF_SIZE = 16
RUN_NODES = 2
SLEEP_S = "99917"  # the sleeper's argument: these jobs' processes are recognisable
XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1234, GPU has fallen off the bus."


def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def mem_available_gib() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return 0.0


class TimedSlurm(CliSlurmClient):
    """The CLI client, with every call counted and timed by method."""

    def __init__(self, settings: Settings) -> None:
        cluster = default_cluster(settings)
        super().__init__(settings, OwnerGate(settings, cluster), cluster)
        self.seconds: dict[str, list[float]] = {}

    def __getattribute__(self, name: str) -> Any:
        attr = super().__getattribute__(name)
        if name.startswith("_") or name == "seconds" or not callable(attr):
            return attr

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return attr(*args, **kwargs)
            finally:
                self.seconds.setdefault(name, []).append(time.perf_counter() - started)

        return timed


class ScaleCluster:
    """slurmctld and N slurmd daemons of the scale cluster, started and stopped by pid."""

    def __init__(self, num_nodes: int, state: Path) -> None:
        self.shape = ClusterShape(num_nodes=num_nodes, leaf_size=LEAF_SIZE)
        self.state = state
        self.conf = state / "slurm.conf"
        self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
        self.daemons: dict[str, subprocess.Popen[bytes]] = {}

    def config_files(self) -> dict[str, str]:
        """slurm.conf and the rest, by file name, as `runyard dev up` renders them (pure)."""
        net = one_box(
            self.shape,
            cluster_name=CLUSTER_NAME,
            first_slurmd_port=FIRST_SLURMD_PORT,
            controller_port=CONTROLLER_PORT,
        )
        return render(self.shape, self.state, network=net)

    def render(self) -> None:
        for sub in ("slurmctld", "slurmd", "run", "log", "dev", "jobs", "checkpoints"):
            (self.state / sub).mkdir(parents=True, exist_ok=True)
        for name, text in self.config_files().items():
            (self.state / name).write_text(text)
        for i in range(self.shape.gpus_per_node):  # as `runyard dev up` makes them
            os.mknod(self.state / "dev" / f"nvidia{i}", 0o666 | 0o020000, os.makedev(195, i))

    def spawn(self, key: str, argv: list[str]) -> None:
        log = open(self.state / "log" / f"{key}.out", "ab")  # noqa: SIM115
        self.daemons[key] = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=self.env,
            start_new_session=True,
        )

    def sinfo(self) -> dict[str, str]:
        out = subprocess.run(
            ["sinfo", "-h", "-N", "-o", "%N %T"],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=60,
        )
        return dict(line.split() for line in out.stdout.splitlines() if line.strip())

    def up(self, timeout_s: float) -> float:
        """Start everything; seconds until every node is idle."""
        started = time.monotonic()
        self.render()
        self.spawn("slurmctld", ["slurmctld", "-D", "-f", str(self.conf)])
        wait_for(lambda: self.run(["scontrol", "ping"]).returncode == 0, 30, "slurmctld")
        for node in self.shape.node_names:
            self.spawn(f"slurmd-{node}", ["slurmd", "-D", "-N", node, "-f", str(self.conf)])
        names = set(self.shape.node_names)
        wait_for(
            lambda: names <= {n for n, s in self.sinfo().items() if s == "idle"},
            timeout_s,
            f"{len(names)} idle nodes",
        )
        return time.monotonic() - started

    def run(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=60)

    def memory_mib(self) -> dict[str, float]:
        slurmd = [rss_mib(p.pid) for k, p in self.daemons.items() if k.startswith("slurmd-")]
        return {
            "slurmctld_mib": rss_mib(self.daemons["slurmctld"].pid),
            "slurmd_mean_mib": statistics.mean(slurmd),
            "slurmd_total_mib": sum(slurmd),
        }

    def down(self) -> None:
        """Cancel this cluster's jobs, stop its daemons (slurmd first) by pid, then the job
        steps they leave behind (slurmstepd outlives a stopped slurmd)."""
        started = time.monotonic()
        # The jobs' tasks first (8 sleepers per allocated node): scancel of hundreds of
        # nodes' worth of them took over a minute on 2 cores, and left steps behind.
        for pid in self.job_steps(comm="sleep"):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.run(["scancel", "--partition", "train"])
        deadline = time.monotonic() + 30
        with contextlib.suppress(subprocess.TimeoutExpired):
            while time.monotonic() < deadline and self.run(["squeue", "-h"]).stdout.strip():
                time.sleep(1)
        for key in sorted(self.daemons, key=lambda k: k == "slurmctld"):
            proc = self.daemons[key]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.daemons.values():
            try:
                proc.wait(timeout=max(1.0, started + 120 - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        steps = self.job_steps()
        for pid in steps:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        print(
            f"scale cluster stopped in {time.monotonic() - started:.0f} s "
            f"({len(steps)} leftover job steps killed)",
            file=sys.stderr,
        )

    def job_steps(self, comm: str = "slurmstepd") -> list[int]:
        """This cluster's `comm` processes (its job steps, or its jobs' sleepers): their
        SLURM_CONF or their folder is ours."""
        pids = []
        for proc in Path("/proc").glob("[0-9]*"):
            with contextlib.suppress(OSError):
                if (proc / "comm").read_text().strip() != comm:
                    continue
                environ = (proc / "environ").read_bytes().split(b"\0")
                cwd = os.readlink(proc / "cwd")
                if f"SLURM_CONF={self.conf}".encode() in environ or cwd.startswith(str(self.state)):
                    pids.append(int(proc.name))
        return pids


def wait_for(check: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise SystemExit(f"bench: {what} not there within {timeout_s:.0f} s")
        time.sleep(1)


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


def clocked_tick(reconciler: Reconciler, slurm: TimedSlurm) -> dict[str, Any]:
    """One tick: its wall time, the placement step's, and the Slurm calls it made."""
    inner = placement.place_pending
    placed: list[float] = []

    def timed(*args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return inner(*args, **kwargs)
        finally:
            placed.append(time.perf_counter() - t0)

    placement.place_pending = timed  # type: ignore[assignment]
    slurm.seconds.clear()
    started = time.perf_counter()
    try:
        reconciler.tick()
        reservations = {
            k: [round(x, 3) for x in slurm.seconds[k]]
            for k in ("create_reservation", "update_reservation")
            if k in slurm.seconds
        }
    finally:
        placement.place_pending = inner  # type: ignore[assignment]
    return {
        "tick_s": time.perf_counter() - started,
        "placement_s": sum(placed),
        "slurm_calls": {k: len(v) for k, v in slurm.seconds.items()},
        "slurm_seconds": {k: round(sum(v), 3) for k, v in slurm.seconds.items()},
        "reservations": reservations,
    }


def counts() -> dict[str, int]:
    with session_scope() as session:
        return {
            "pending": len(repository.runs_in_states(session, [RunState.PENDING])),
            "running": len(repository.runs_in_states(session, [RunState.RUNNING])),
        }


def running_jobs_of(run_id: int) -> bool:
    with session_scope() as session:
        run = repository.get_run(session, run_id)
        assert run is not None
        live = repository.live_attempt(run)
        return live is not None and live.state == AttemptState.RUNNING


def measure(
    num_nodes: int, running: int, queued: int, num_spares: int, state: Path
) -> dict[str, Any]:
    cluster = ScaleCluster(num_nodes, state)
    figures: dict[str, Any] = {"nodes": num_nodes, "mem_available_before_gib": mem_available_gib()}
    try:
        figures["up_s"] = cluster.up(timeout_s=max(120.0, num_nodes * 0.5))
        figures |= cluster.memory_mib()
        print(
            f"{num_nodes} slurmd idle {figures['up_s']:.0f} s after the start; slurmctld "
            f"{figures['slurmctld_mib']:.0f} MiB, slurmd {figures['slurmd_mean_mib']:.1f} MiB "
            f"each ({figures['slurmd_total_mib']:.0f} MiB in all)"
        )
        sleeper = state / "sleeper"
        sleeper.write_text(f"#!/bin/sh\nexec sleep {SLEEP_S}\n")
        sleeper.chmod(0o755)
        postgres.ensure_running()
        postgres.fresh_database(DATABASE_URL)
        settings = Settings(
            state_dir=state,
            slurm_conf=cluster.conf,
            job_prefix="devscale",
            run_reconciler=False,
            worker_python=str(sleeper),
        )
        slurm = TimedSlurm(settings)
        reconciler = Reconciler(settings, slurm)
        reconciler.tick()  # the nodes, from Slurm
        running = min(running, (num_nodes - num_spares) // RUN_NODES)
        # Queued runs one node larger than what is left free: they wait, as in a full cluster.
        queued_nodes = num_nodes - num_spares - running * RUN_NODES + 1
        with session_scope() as session:
            spares.set_target(session, slurm.cluster_name, num_spares)
            ids = [
                create_run(session, spec(f"train-{i}", RUN_NODES), settings).id
                for i in range(running)
            ]
            for i in range(queued):
                create_run(session, spec(f"queued-{i}", queued_nodes), settings)
        started = time.monotonic()
        setup_ticks = []
        while time.monotonic() - started < 300:
            setup_ticks.append(clocked_tick(reconciler, slurm))
            if counts()["running"] >= running:
                break
        steps = cluster.job_steps()
        figures["job_steps"] = len(steps)
        figures["job_steps_mib"] = sum(rss_mib(p) for p in steps)
        figures["mem_available_gib"] = mem_available_gib()
        figures["runs_running"] = counts()["running"]
        figures["runs_waiting"] = counts()["pending"]
        figures["setup_s"] = time.monotonic() - started
        print(
            f"{figures['runs_running']} runs of {RUN_NODES} running, "
            f"{figures['runs_waiting']} waiting ({queued} of {queued_nodes} nodes), "
            f"{num_spares} spares: {len(setup_ticks)} ticks, {figures['setup_s']:.0f} s"
        )
        steady = [clocked_tick(reconciler, slurm) for _ in range(3)]
        figures["tick_s"] = statistics.median(t["tick_s"] for t in steady)
        figures["tick_max_s"] = max(t["tick_s"] for t in steady)
        figures["placement_s"] = statistics.median(t["placement_s"] for t in steady)
        figures["slurm_calls_per_tick"] = steady[-1]["slurm_calls"]
        figures["slurm_seconds_per_tick"] = steady[-1]["slurm_seconds"]

        # Reservations as the reconciler made them while the runs started (the pool's and
        # each run's), then one created on 4 idle nodes and updated to 8, through the client.
        made = [t["reservations"] for t in setup_ticks]
        figures["reservation_calls_at_setup"] = {
            k: {"count": len(v), "median_s": statistics.median(v), "max_s": max(v)}
            for k in ("create_reservation", "update_reservation")
            if (v := [x for m in made for x in m.get(k, [])])
        }
        free = [n for n, s in cluster.sinfo().items() if s == "idle"]
        if len(free) >= 8:
            slurm.seconds.clear()
            slurm.create_reservation("devscale-probe", free[:4])
            slurm.update_reservation("devscale-probe", free[:8])
            slurm.delete_reservation("devscale-probe")
            figures["reservation_probe_s"] = {k: round(v[0], 3) for k, v in slurm.seconds.items()}

        # A recovery: Xid 79 on a node of a running run.
        victim_run = ids[0]
        with session_scope() as session:
            run = repository.get_run(session, victim_run)
            assert run is not None
            victim = run.nodes[-1]
            event = SignalIn(f"{victim}-xid-79", "xid", 79, XID_79, None, {})
            ingest_node_events(session, slurm.cluster_name, victim, [event], settings, Classifier())
        started = time.monotonic()
        recovery = clocked_tick(reconciler, slurm)
        ticks = 1
        while not running_jobs_of(victim_run) and ticks < 10:
            clocked_tick(reconciler, slurm)
            ticks += 1
        with session_scope() as session:
            run = repository.get_run(session, victim_run)
            assert run is not None
            moved = victim not in run.nodes
        figures["recovery_tick_s"] = recovery["tick_s"]
        figures["recovery_tick_slurm_calls"] = recovery["slurm_calls"]
        figures["recovery_to_running_s"] = time.monotonic() - started
        figures["recovery_ticks"] = ticks
        figures["recovered"] = moved and running_jobs_of(victim_run)
        print(
            f"recovery: Xid 79 on {victim} (run {victim_run}): drained and resubmitted in one "
            f"tick of {recovery['tick_s']:.2f} s; its next job running after {ticks} ticks, "
            f"{figures['recovery_to_running_s']:.1f} s; moved off {victim}: {moved}"
        )
    except BaseException:
        print(json.dumps(figures, default=str), file=sys.stderr)  # what was measured
        raise
    finally:
        cluster.down()
    return figures


def target_met(figures: dict[str, Any]) -> bool:
    """Runs running, and the failed node's run moved and running again within 10 ticks."""
    return bool(
        figures.get("runs_running", 0) > 0
        and figures.get("recovered", False)
        and figures.get("recovery_ticks", 99) <= 10
    )


# --smoke's figures, made up in measure()'s shape (a few of its keys).
SMOKE_FIGURES: dict[str, Any] = {
    "nodes": LEAF_SIZE,
    "up_s": 4.0,
    "runs_running": 6,
    "runs_waiting": 2,
    "tick_s": 0.12,
    "placement_s": 0.004,
    "recovery_tick_s": 0.3,
    "recovery_ticks": 2,
    "recovered": True,
}


def smoke() -> None:
    """One leaf's config rendered as the run renders it, and the verdict on SMOKE_FIGURES."""
    cluster = ScaleCluster(LEAF_SIZE, Path(tempfile.gettempdir()) / "runyard-devscale-smoke")
    files = cluster.config_files()  # text only: nothing is written or started
    conf = files["slurm.conf"]
    ours = f"ClusterName={CLUSTER_NAME}" in conf and f"SlurmctldPort={CONTROLLER_PORT}" in conf
    print(f"{LEAF_SIZE} nodes' config: {', '.join(sorted(files))}; own name and port: {ours}")
    for key, value in SMOKE_FIGURES.items():
        print(f"{key:28s} {value}")
    out = {
        "bench": "devcluster_scale",
        "smoke": True,
        "inputs": "made-up figures; no cluster started",
        "config_files": sorted(files),
        "figures": SMOKE_FIGURES,
        "target_met": ours and target_met(SMOKE_FIGURES),
    }
    print(json.dumps(out))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nodes", type=int, default=256)
    parser.add_argument("--queued", type=int, default=40)
    parser.add_argument("--running", type=int, default=48, help="runs of 2 nodes")
    parser.add_argument("--spares", type=int, default=4)
    parser.add_argument("--smoke", action="store_true", help="the pure parts: starts nothing")
    args = parser.parse_args(argv)
    if args.smoke:
        smoke()
        return
    state = Path(tempfile.mkdtemp(prefix="runyard-devscale-"))
    # The service's Slurm commands (get_settings) and submitit's sbatch read these.
    os.environ["RUNYARD_SLURM_CONF"] = os.environ["SLURM_CONF"] = str(state / "slurm.conf")
    try:
        figures = measure(args.nodes, args.running, args.queued, args.spares, state)
    finally:
        shutil.rmtree(state, ignore_errors=True)
    for key, value in figures.items():
        print(f"{key:28s} {value}")
    met = target_met(figures)
    print(json.dumps({"bench": "devcluster_scale", "figures": figures, "target_met": met}))


if __name__ == "__main__":
    main()
