"""The control plane under a 10,240-GPU cluster's load, on the real service and Postgres.

1,280 simulated agents, each with its own agent token, heartbeat every 5 s (256 requests/s,
open loop: a late reply does not slow the next beat down) while 4 streams post batches of 100
node events as fast as they are accepted; then a whole leaf switch of the dev cluster (its 4
real nodes) reports Xid 79 at once and we time how long the recovery loop takes to drain all
of them in Slurm.

    runyard dev up && .venv/bin/python bench/control_plane.py [--seconds 20]

The service runs as its own process, started as the dev cluster starts it, on a database of
its own (`runyard_bench`); every reply is a real HTTP reply after the service's commit.
The first heartbeat period is a warm-up, under the same load: each agent's first request
after a service start has its token looked up, later ones find it cached. The figures are
those of the `--seconds` after it; the warm-up's p99 latencies are printed too. Latency is
measured from when a request was due, so time a request spent waiting for a free
connection in the bench counts. The load generator is a minimal keep-alive HTTP/1.1 client
on asyncio: on 2 cores, httpx's connection pool spent more CPU per request than the service
did (its request queue is scanned per request), and the bench measured itself.

The last line is one JSON object with the figures, the targets (>= 5,000 events/s
sustained, p99 latency < 100 ms for event batches and heartbeats, no failed request) and
"target_met".

    .venv/bin/python bench/control_plane.py --nodes 1280 [--seconds 10]

A recovery storm at 10,240 GPUs: a whole leaf switch (16 nodes) fails while 1,280
simulated agents heartbeat. The dev cluster has 8 real nodes, so the cluster this mode
drives is the in-memory SlurmClient (service/slurm/fake.py): 1,280 nodes on leaf switches
of 16, run by the real `Reconciler` (every step, one tick a second) in a process of its
own, on the same fresh database as the real service, which runs as in the first mode
(HTTP only: RUNYARD_RUN_RECONCILER=false, so one reconciler acts). That process creates
200 runs of 6 nodes through the service's `create_run`, the spare pool at the size
`service.recovery.spares.pool_target` gives (19), places and starts them, and then ticks.
The bench sends every agent's heartbeat over HTTP (one per node every 5 s) and a stream of
observe-only Xid 92 batches; after `--seconds` the 16 agents of a leaf switch whose nodes
all train runs fall silent (the switch took their management traffic with it) and the load
goes on. Measured from Postgres: the silence to the service's verdict (its
heartbeat_dead_s, 20 s), the verdict to each affected run's next attempt submitted on
nodes off the leaf (the target: within 10 s) and started by Slurm. "Nothing lost": every
request answered 2xx, every accepted event stored, one incident per silent node and none
for any other, every run still active on 6 healthy nodes.

    .venv/bin/python bench/control_plane.py --smoke   # no dev cluster, no service: seconds

--smoke starts no service and touches neither the dev cluster nor Postgres: the bench's own
load generator (heartbeats and event batches on its keep-alive client) runs for a second
against a stand-in that answers as the service does (StubService: 204 to a heartbeat, the
count of a batch's events accepted), and the first mode's figures and verdict come from it;
the storm's are computed from a made-up outcome in storm_outcome()'s shape (SMOKE_STORM).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Collection
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import psycopg

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from client.devcluster import postgres  # noqa: E402
from client.devcluster.cluster import DevCluster, default_state_dir, service_argv  # noqa: E402
from service.auth.bootstrap import mint_token_file  # noqa: E402
from service.auth.tokens import hash_token, new_token  # noqa: E402
from service.models import Role  # noqa: E402

DATABASE = "runyard_bench"
NUM_NODES = 1280
HEARTBEAT_PERIOD_S = 5.0
HEARTBEAT_CONNECTIONS = 32  # agents on a real fleet each hold their own; 32 keeps up here
WARMUP_S = HEARTBEAT_PERIOD_S  # every agent has spoken once: its token is known
EVENT_STREAMS = 4
EVENT_BATCH = 100
TARGET_EVENTS_PER_S = 5000
TARGET_P99_S = 0.100
LEAF = ["gpu001", "gpu002", "gpu003", "gpu004"]
XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."
XID_92 = "NVRM: Xid (PCI:0000:3b:00): 92, High single-bit ECC error rate"
HEARTBEAT_BODY = json.dumps({"agent_version": "0.2", "gpu_present": True}).encode()


def sim_node(i: int) -> str:
    return f"sim{i % NUM_NODES + 1:04d}"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fresh_database(*, sim_nodes: bool = True) -> str:
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{DATABASE}"
    postgres.fresh_database(url)
    if not sim_nodes:
        return url
    with psycopg.connect(url.replace("+psycopg", "")) as conn:
        conn.execute(
            "INSERT INTO nodes (name, state, state_reason, slurm_state, slurm_reason, addr, "
            "num_gpus, num_app_errors) SELECT 'sim' || lpad(i::text, 4, '0'), 'HEALTHY', "
            "'simulated', 'IDLE', '', '10.0.0.1', 8, 0 FROM generate_series(1, %s) AS i",
            (NUM_NODES,),
        )
    return url


def mint_agent_tokens(url: str, names: list[str] | None = None) -> dict[str, str]:
    """One agent token per simulated node, as `runyard dev up` gives each real agent."""
    names = names or [sim_node(i) for i in range(NUM_NODES)]
    secrets = {n: new_token() for n in names}
    with psycopg.connect(url.replace("+psycopg", "")) as conn, conn.cursor() as cur:
        cur.execute(
            "INSERT INTO teams (name, created_at) VALUES ('ops', now()) ON CONFLICT DO NOTHING"
        )
        cur.executemany(
            'INSERT INTO api_tokens (token_hash, prefix, "user", team, role, node_name, '
            "created_at) VALUES (%s, %s, %s, 'ops', 'agent', %s, now())",
            [(hash_token(s), s[:10], f"agent-{n}", n) for n, s in secrets.items()],
        )
    return secrets


def start_service(
    url: str, dev: DevCluster, port: int, state: Path, *, reconciler: bool = True
) -> subprocess.Popen[bytes]:
    # Plain HTTP on loopback (no RUNYARD_TLS_*): the bench's own connections (Connection)
    # speak HTTP/1.1 without TLS, and measure the service, not the handshake.
    machine = {k: v for k, v in os.environ.items() if not k.startswith("RUNYARD_TLS_")}
    env = {
        **machine,
        "RUNYARD_DATABASE_URL": url,
        "RUNYARD_STATE_DIR": str(state),
        "RUNYARD_SLURM_CONF": str(dev.slurm_conf),
        "SLURM_CONF": str(dev.slurm_conf),
        "RUNYARD_HEARTBEAT_SUSPECT_S": "60",
        "RUNYARD_RUN_RECONCILER": "true" if reconciler else "false",
        "RUNYARD_HOST": "127.0.0.1",
        "RUNYARD_PORT": str(port),
    }
    with open(state / "svc.log", "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            service_argv(),
            env=env,
            cwd=REPO_ROOT,
            stdout=subprocess.DEVNULL,
            stderr=log,
        )
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.3)
    raise SystemExit("bench: the service did not start")


class Connection:
    """One keep-alive HTTP/1.1 connection: write a request, read its reply."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Connection:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def post(self, path: str, token: str, body: bytes) -> tuple[int, bytes]:
        self.writer.write(
            f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1\r\nauthorization: Bearer {token}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n".encode()
            + body
        )
        head = await self.reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        length = 0
        for line in head.lower().split(b"\r\n"):
            if line.startswith(b"content-length:"):
                length = int(line[15:])
        return status, await self.reader.readexactly(length) if length else b""

    def close(self) -> None:
        self.writer.close()


class Tally:
    """Requests that succeeded (latency, events accepted) and failed, in and after warm-up.

    Requests started before `measured_from` are the warm-up: every agent's first request
    after the service starts needs its token looked up (the service caches it afterwards),
    which is not the sustained state. Their figures are reported apart, and failures in
    either phase fail the target.
    """

    def __init__(self, measured_from: float) -> None:
        self.measured_from = measured_from
        self.latencies_s: list[float] = []
        self.warmup_latencies_s: list[float] = []
        self.started_s: list[float] = []  # when each measured request was due
        self.accepted = 0
        self.failures: dict[str, int] = {}

    def ok(self, started: float, accepted: int = 0) -> None:
        if started < self.measured_from:
            self.warmup_latencies_s.append(time.monotonic() - started)
        else:
            self.latencies_s.append(time.monotonic() - started)
            self.started_s.append(started)
            self.accepted += accepted

    def p99_between(self, t0: float, t1: float) -> float | None:
        xs = [x for s, x in zip(self.started_s, self.latencies_s, strict=True) if t0 <= s < t1]
        return statistics.quantiles(xs, n=100)[98] if len(xs) >= 100 else None

    def fail(self, why: str) -> None:
        self.failures[why] = self.failures.get(why, 0) + 1


async def heartbeats(
    port: int,
    tokens: dict[str, str],
    until: float,
    tally: Tally,
    silent: Collection[str] = (),
    silent_from: float = math.inf,
) -> None:
    """Every simulated node once per period, spread evenly over it; the `silent` ones
    (a failed leaf switch's) send none due from `silent_from` on."""
    names = list(tokens)
    idle: asyncio.Queue[Connection] = asyncio.Queue()
    for _ in range(HEARTBEAT_CONNECTIONS):
        idle.put_nowait(await Connection.open(port))
    sent, gap = 0, HEARTBEAT_PERIOD_S / len(names)
    start = time.monotonic()
    pending: set[asyncio.Task[None]] = set()

    async def one(name: str, due: float) -> None:
        conn = await idle.get()
        try:
            status, _ = await conn.post(f"/v1/nodes/{name}/heartbeat", tokens[name], HEARTBEAT_BODY)
        except (OSError, asyncio.IncompleteReadError) as exc:
            tally.fail(type(exc).__name__)
            idle.put_nowait(await Connection.open(port))
            return
        idle.put_nowait(conn)
        if status == 204:
            tally.ok(due)  # from when the beat was due: waiting for a connection counts
        else:
            tally.fail(f"HTTP {status}")

    while (due := start + sent * gap) < until:
        await asyncio.sleep(max(0.0, due - time.monotonic()))
        name = names[sent % len(names)]
        if due >= silent_from and name in silent:
            sent += 1
            continue
        task = asyncio.create_task(one(name, due))
        pending.add(task)
        task.add_done_callback(pending.discard)
        sent += 1
    await asyncio.gather(*pending)
    while not idle.empty():
        idle.get_nowait().close()


async def events(
    port: int,
    tokens: dict[str, str],
    until: float,
    tally: Tally,
    streams: int = EVENT_STREAMS,
    pause_s: float = 0.0,
    silent: Collection[str] = (),
) -> None:
    """Batches of observe-only events (corrected-ECC Xid 92) as fast as they are accepted
    (or one batch per stream every `pause_s`), from every node but the `silent` ones."""
    names = [n for n in tokens if n not in silent]

    async def stream(worker: int) -> None:
        conn = await Connection.open(port)
        n = worker
        while time.monotonic() < until:
            node = names[n % len(names)]
            body = json.dumps(
                {
                    "events": [
                        {
                            "idempotency_key": str(uuid.uuid4()),
                            "kind": "xid",
                            "code": 92,
                            "message": XID_92,
                        }
                        for _ in range(EVENT_BATCH)
                    ]
                }
            ).encode()
            t0 = time.monotonic()
            status, reply = await conn.post(f"/v1/nodes/{node}/events", tokens[node], body)
            if status == 200:
                tally.ok(t0, json.loads(reply)["accepted"])
            else:
                tally.fail(f"HTTP {status}")
            n += streams
            if pause_s:
                await asyncio.sleep(max(0.0, t0 + pause_s - time.monotonic()))
        conn.close()

    await asyncio.gather(*(stream(w) for w in range(streams)))


async def sustained(
    port: int, seconds: float, tokens: dict[str, str], warmup_s: float = WARMUP_S
) -> dict[str, float]:
    """One heartbeat period of warm-up (`warmup_s`), then `seconds` of the same load,
    measured."""
    start = time.monotonic()
    measured_from = start + warmup_s
    until = measured_from + seconds
    beats, batches = Tally(measured_from), Tally(measured_from)
    await asyncio.gather(
        heartbeats(port, tokens, until, beats), events(port, tokens, until, batches)
    )
    elapsed = time.monotonic() - measured_from  # until the last reply
    q = lambda xs, p: statistics.quantiles(xs, n=100)[p - 1]  # noqa: E731
    for kind, tally in (("heartbeat", beats), ("event batch", batches)):
        for why, count in tally.failures.items():
            print(f"bench: {count} {kind} requests failed: {why}", file=sys.stderr)
    return {
        "seconds": elapsed,
        "heartbeats_per_s": len(beats.latencies_s) / elapsed,
        "events_per_s": batches.accepted / elapsed,
        "event_batch_p50_s": q(batches.latencies_s, 50),
        "event_batch_p99_s": q(batches.latencies_s, 99),
        "heartbeat_p50_s": q(beats.latencies_s, 50),
        "heartbeat_p99_s": q(beats.latencies_s, 99),
        "failed_requests": sum(beats.failures.values()) + sum(batches.failures.values()),
        "warmup_event_batch_p99_s": q(batches.warmup_latencies_s, 99),
        "warmup_heartbeat_p99_s": q(beats.warmup_latencies_s, 99),
    }


def leaf_burst(url: str, token: str) -> float:
    """All four nodes of leaf1 report Xid 79 at once: seconds until all are drained."""
    started = time.monotonic()
    with httpx.Client(
        base_url=url, timeout=30, headers={"Authorization": f"Bearer {token}"}
    ) as client:
        for node in LEAF:
            client.post(
                f"/v1/nodes/{node}/events",
                json={
                    "events": [
                        {
                            "idempotency_key": str(uuid.uuid4()),
                            "kind": "xid",
                            "code": 79,
                            "message": XID_79,
                        }
                    ]
                },
            ).raise_for_status()
        while time.monotonic() - started < 60:
            drained = {
                i["node_name"]
                for i in client.get("/v1/admin/incidents").json()
                if i["drained_at"] and i["node_name"] in LEAF
            }
            if drained == set(LEAF):
                elapsed = time.monotonic() - started
                for node in LEAF:
                    client.post(f"/v1/admin/nodes/{node}/resume", json={})
                return elapsed
            time.sleep(0.05)
    raise SystemExit("bench: the leaf's nodes were not all drained within 60 s")


# --- --nodes N: a leaf switch fails under 1,280 nodes (the in-memory SlurmClient) --------

NODES_PER_LEAF = 16
STORM_RUNS, STORM_RUN_NODES = 200, 6
TARGET_MOVE_S = 10.0
STORM_EVENT_STREAMS, STORM_EVENT_PAUSE_S = 1, 0.1  # 1,000 events/s beside the heartbeats
AFTER_SILENCE_S = 40.0  # heartbeat_dead_s (20 s), a tick, the moves, and a margin


def in_memory_reconciler(state: Path, num_nodes: int) -> None:
    """The child process of `--nodes`: the real Reconciler against an in-memory Slurm of
    `num_nodes` nodes, ticking once a second until state/stop appears. It writes
    state/ready.json once its runs are running and state/ticks.json at the end."""
    from planner import reliability
    from service.config import Settings
    from service.db import session_scope
    from service.models import RunState
    from service.reconcile.loop import Reconciler
    from service.recovery import spares
    from service.runs import repository
    from service.runs.schemas import RunSpec
    from service.runs.service import create_run
    from service.slurm.fake import FakeSlurm
    from sim.run_shape import planned_run

    settings = Settings(state_dir=state, job_prefix="storm", run_reconciler=False)
    slurm = FakeSlurm.cluster(
        num_switches=num_nodes // NODES_PER_LEAF, nodes_per_switch=NODES_PER_LEAF
    )
    reconciler = Reconciler(settings, slurm)
    reconciler.tick()  # the nodes, from Slurm
    # The pool the spares policy gives a 10,240-GPU run at Llama 3's failure rate (the
    # planner's pool for independent failures, plus a leaf switch, capped at 1.5%): 19.
    shape = planned_run()
    rel = reliability.assess(shape.model, shape.num_gpus, 8, shape.step_s)
    pool = spares.pool_target(
        independent=rel.spare_nodes, nodes_per_leaf=NODES_PER_LEAF, run_nodes=num_nodes
    )
    spec = RunSpec.model_validate(
        {
            "name": "train",
            "model": "tiny",
            "nodes": STORM_RUN_NODES,
            "gpus_per_node": 8,
            "seq_len": 128,
            "global_batch": 8 * 8 * STORM_RUN_NODES,
            "steps": 100_000,
            "checkpoint_every": 100,
            "max_restarts": 3,
        }
    )
    with session_scope() as session:
        spares.set_target(session, slurm.cluster_name, pool)
        for i in range(STORM_RUNS):
            create_run(session, spec.model_copy(update={"name": f"train-{i}"}), settings)
    for _ in range(3):
        reconciler.tick()
        slurm.schedule()
    with session_scope() as session:
        runs = {r.id: list(r.nodes) for r in repository.runs_in_states(session, [RunState.RUNNING])}
    (state / "ready.json").write_text(
        json.dumps(
            {
                "runs": runs,
                "pool": pool,
                "switch": {n.name: n.switch for n in slurm.nodes.values()},
            }
        )
    )
    ticks: list[float] = []
    while not (state / "stop").exists():
        started = time.monotonic()
        reconciler.tick()
        slurm.schedule()  # Slurm starts what was submitted
        ticks.append(time.monotonic() - started)
        time.sleep(max(0.0, settings.reconcile_interval_s - ticks[-1]))
    (state / "ticks.json").write_text(json.dumps(ticks))


async def storm_load(
    port: int, tokens: dict[str, str], leaf: list[str], before_s: float
) -> tuple[Tally, Tally, dict[str, float | None], datetime]:
    """Heartbeats and events; `before_s` after the first beat the leaf falls silent."""
    start = time.monotonic()
    silent_from = start + before_s
    until = silent_from + AFTER_SILENCE_S
    beats, batches = Tally(start), Tally(start)
    silence_wall = datetime.now(UTC).timestamp() + before_s
    await asyncio.gather(
        heartbeats(port, tokens, until, beats, silent=set(leaf), silent_from=silent_from),
        events(
            port,
            tokens,
            until,
            batches,
            streams=STORM_EVENT_STREAMS,
            pause_s=STORM_EVENT_PAUSE_S,
            silent=set(leaf),
        ),
    )
    windows = {
        "first_period": beats.p99_between(start, start + HEARTBEAT_PERIOD_S),
        "before_silence": beats.p99_between(start + HEARTBEAT_PERIOD_S, silent_from),
        "silence_to_verdict": beats.p99_between(silent_from, silent_from + 20),
        "after_verdict": beats.p99_between(silent_from + 20, until),
    }
    return beats, batches, windows, datetime.fromtimestamp(silence_wall, UTC)


def storm_outcome(
    url: str, ready: dict[str, Any], leaf: list[str], silence: datetime
) -> dict[str, Any]:
    """What the service did, read from Postgres."""
    leaf_set = set(leaf)
    affected = {int(r): n for r, n in ready["runs"].items() if leaf_set & set(n)}
    with psycopg.connect(url.replace("+psycopg", "")) as conn:
        incidents = conn.execute(
            "SELECT node_name, signal, detected_at, drained_at, run_id, spare_node "
            "FROM incidents ORDER BY id"
        ).fetchall()
        runs = {
            r[0]: (r[1], list(r[2]))
            for r in conn.execute("SELECT id, state::text, nodes FROM runs").fetchall()
        }
        attempts = conn.execute(
            "SELECT DISTINCT ON (run_id) run_id, submitted_at, started_at, state::text, nodes "
            "FROM attempts ORDER BY run_id, id DESC"
        ).fetchall()
        stored_events = conn.execute(
            "SELECT count(*) FROM node_events WHERE kind = 'xid' AND code = 92"
        ).fetchone()
        node_states: dict[str, str] = dict(
            conn.execute("SELECT name, state::text FROM nodes").fetchall()
        )
    newest = {a[0]: a for a in attempts}
    on_leaf = [i for i in incidents if i[0] in leaf_set]
    detected = {i[0]: i[2] for i in on_leaf}
    verdict_at = max(detected.values()) if len(detected) == len(leaf) else None
    moves: dict[int, dict[str, Any]] = {}
    for run_id, before in affected.items():
        state, nodes = runs[run_id]
        attempt = newest.get(run_id)
        first_detect = min(detected[n] for n in before if n in detected) if detected else None
        submitted = attempt[1] if attempt else None
        moved = (
            submitted is not None
            and first_detect is not None
            and submitted > first_detect
            and not leaf_set & set(nodes)
            and len(nodes) == STORM_RUN_NODES
        )
        moves[run_id] = {
            "state": state,
            "moved": moved,
            "nodes_on_leaf_before": len(leaf_set & set(before)),
            "verdict_to_submitted_s": (submitted - first_detect).total_seconds()
            if moved and submitted and first_detect
            else None,
            "verdict_to_running_s": (attempt[2] - first_detect).total_seconds()
            if moved and attempt and attempt[2] and first_detect
            else None,
        }
    lost_runs = [r for r, (state, _) in runs.items() if state not in ("RUNNING", "PENDING")]
    bad_nodes = [n for n, st in node_states.items() if st in ("DRAINED", "DRAINING")]
    return {
        "leaf": ready["switch"][leaf[0]],
        "affected_runs": len(affected),
        "moves": moves,
        "incidents_on_leaf": len(on_leaf),
        "incidents_elsewhere": len(incidents) - len(on_leaf),
        "signals": sorted({i[1] for i in on_leaf}),
        "silence_to_verdict_s": (verdict_at - silence).total_seconds() if verdict_at else None,
        "all_drained": all(i[3] is not None for i in on_leaf) and len(on_leaf) == len(leaf),
        "drained_not_on_leaf": sorted(set(bad_nodes) - leaf_set),
        "runs_not_active": lost_runs,
        "stored_events": stored_events[0] if stored_events else 0,
    }


def storm(num_nodes: int, before_s: float) -> None:
    dev = DevCluster(default_state_dir())
    port = free_port()
    url = fresh_database(sim_nodes=False)
    with tempfile.TemporaryDirectory() as tmp:
        state = Path(tmp)
        child_env = {**os.environ, "RUNYARD_DATABASE_URL": url}
        child = subprocess.Popen(
            [sys.executable, __file__, "--in-memory-reconciler", str(state), str(num_nodes)],
            env=child_env,
            cwd=REPO_ROOT,
            stderr=open(state / "reconciler.log", "wb"),  # noqa: SIM115
        )
        proc = None
        try:
            deadline = time.monotonic() + 600
            while not (state / "ready.json").exists():
                if child.poll() is not None or time.monotonic() > deadline:
                    raise SystemExit(
                        "bench: the in-memory reconciler did not start: "
                        + (state / "reconciler.log").read_text()[-2000:]
                    )
                time.sleep(0.5)
            ready = json.loads((state / "ready.json").read_text())
            switch = ready["switch"]
            held = {n for nodes in ready["runs"].values() for n in nodes}
            # The first leaf whose every node trains a run: the worst case for the pool.
            leaves: dict[str, list[str]] = {}
            for node in sorted(switch):
                leaves.setdefault(switch[node], []).append(node)
            leaf = next(ns for ns in leaves.values() if set(ns) <= held)
            print(
                f"{len(switch)} nodes on {len(leaves)} leaf switches (in-memory Slurm), "
                f"{len(ready['runs'])} runs of {STORM_RUN_NODES} nodes running, "
                f"{ready['pool']} spares; {switch[leaf[0]]} ({len(leaf)} nodes) fails "
                f"{before_s:.0f} s into the load"
            )
            tokens = mint_agent_tokens(url, sorted(switch))
            mint_token_file(url, state / "admin.token", user="bench", team="ops", role=Role.ADMIN)
            proc = start_service(url, dev, port, state, reconciler=False)
            beats, batches, windows, silence = asyncio.run(storm_load(port, tokens, leaf, before_s))
            time.sleep(2)  # the reconciler's last tick
        finally:
            (state / "stop").touch()
            if proc is not None:
                proc.terminate()
                proc.wait(timeout=15)
            child.wait(timeout=60)
        ticks = json.loads((state / "ticks.json").read_text())
        out = storm_outcome(url, ready, leaf, silence)
    print(json.dumps(storm_report(ready, out, beats, batches, windows, ticks), default=str))


def storm_report(
    ready: dict[str, Any],
    out: dict[str, Any],
    beats: Tally,
    batches: Tally,
    windows: dict[str, float | None],
    ticks: list[float],
) -> dict[str, Any]:
    """The storm's figures, printed, and its JSON object with the targets and "target_met"."""
    q = lambda xs, p: statistics.quantiles(xs, n=100)[p - 1]  # noqa: E731
    move_s = [m["verdict_to_submitted_s"] for m in out["moves"].values()]
    run_s = [m["verdict_to_running_s"] for m in out["moves"].values()]
    failed = sum(beats.failures.values()) + sum(batches.failures.values())
    for kind, tally in (("heartbeat", beats), ("event batch", batches)):
        for why, count in tally.failures.items():
            print(f"bench: {count} {kind} requests failed: {why}", file=sys.stderr)
    all_moved = bool(move_s) and all(m is not None for m in move_s)
    worst_move = max((m for m in move_s if m is not None), default=None)
    worst_running = max((m for m in run_s if m is not None), default=None)
    figures = {
        "nodes": len(ready["switch"]),
        "runs": len(ready["runs"]),
        "spares": ready["pool"],
        "heartbeats": len(beats.latencies_s),
        "heartbeat_p99_s": q(beats.latencies_s, 99),
        "heartbeat_p99_by_window_s": windows,
        "events_accepted": batches.accepted,
        "events_stored": out["stored_events"],
        "failed_requests": failed,
        "tick_median_s": statistics.median(ticks),
        "tick_max_s": max(ticks),
        "silence_to_verdict_s": out["silence_to_verdict_s"],
        "verdict_to_all_moved_s": worst_move,
        "verdict_to_all_running_s": worst_running,
        "affected_runs": out["affected_runs"],
        "incidents_on_leaf": out["incidents_on_leaf"],
        "incidents_elsewhere": out["incidents_elsewhere"],
        "runs_not_active": out["runs_not_active"],
        "drained_not_on_leaf": out["drained_not_on_leaf"],
        "load_average_1m": round(os.getloadavg()[0], 2),  # 2 cores shared by all: context
    }
    print(
        f"{out['leaf']} silent -> the service's verdict ({', '.join(out['signals'])}): "
        f"{out['silence_to_verdict_s']:.1f} s (heartbeat_dead_s 20 s and a tick)"
        if out["silence_to_verdict_s"] is not None
        else f"{out['leaf']}: not every silent node got an incident"
    )
    for run_id, m in sorted(out["moves"].items()):
        print(
            f"  run {run_id}: {m['nodes_on_leaf_before']} nodes on the leaf; moved {m['moved']}; "
            f"verdict -> next attempt submitted {m['verdict_to_submitted_s']} s, "
            f"running {m['verdict_to_running_s']} s"
        )
    for key, value in figures.items():
        print(f"{key:28s} {value}")
    met = (
        all_moved
        and worst_move is not None
        and worst_move <= TARGET_MOVE_S
        and out["all_drained"]
        and out["incidents_on_leaf"] == NODES_PER_LEAF
        and out["incidents_elsewhere"] == 0
        and not out["runs_not_active"]
        and not out["drained_not_on_leaf"]
        and failed == 0
        and out["stored_events"] == batches.accepted
    )
    return {
        "bench": "control_plane_storm",
        "figures": figures,
        "targets": {
            "verdict_to_all_moved_s": TARGET_MOVE_S,
            "incidents": "one per silent node, none elsewhere",
            "lost": "no failed request, every accepted event stored, no run lost",
        },
        "target_met": met,
    }


class StubService:
    """--smoke's stand-in for the service: a keep-alive HTTP/1.1 server on 127.0.0.1 that
    answers a heartbeat 204 and an event batch 200 with its count accepted, as the service
    does once it has committed them."""

    def __init__(self) -> None:
        self.server: asyncio.Server | None = None

    @property
    def port(self) -> int:
        assert self.server is not None
        return int(self.server.sockets[0].getsockname()[1])

    async def __aenter__(self) -> StubService:
        self.server = await asyncio.start_server(self.serve, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while head := await reader.readuntil(b"\r\n\r\n"):
                length = next(
                    int(line[15:])
                    for line in head.lower().split(b"\r\n")
                    if line.startswith(b"content-length:")
                )
                body = await reader.readexactly(length)
                if head.split(b" ")[1].endswith(b"/heartbeat"):
                    writer.write(b"HTTP/1.1 204 No Content\r\n\r\n")
                else:
                    reply = json.dumps({"accepted": len(json.loads(body)["events"])}).encode()
                    writer.write(
                        b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n"
                        + f"content-length: {len(reply)}\r\n\r\n".encode()
                        + reply
                    )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass  # the client closed its connection
        finally:
            writer.close()


SMOKE_NODES = 64  # simulated agents: a heartbeat every 5 / 64 s
SMOKE_SWITCH = {sim_node(i): f"leaf{i // NODES_PER_LEAF + 1}" for i in range(2 * NODES_PER_LEAF)}
SMOKE_RUNS = {  # runs of 6 nodes: three on the first leaf (the third with 4 nodes), one off it
    str(r + 1): [sim_node(i) for i in range(6 * r, 6 * r + 6)] for r in range(4)
}


def smoke_move(submitted_s: float, on_leaf: int) -> dict[str, Any]:
    return {
        "state": "RUNNING",
        "moved": True,
        "nodes_on_leaf_before": on_leaf,
        "verdict_to_submitted_s": submitted_s,
        "verdict_to_running_s": round(submitted_s + 1.1, 1),
    }


# A made-up storm, in storm()'s and storm_outcome()'s shapes: the first leaf falls silent,
# its 16 nodes get an incident each, and the three runs on it move.
SMOKE_STORM: dict[str, Any] = {
    "ready": {"runs": SMOKE_RUNS, "pool": 2, "switch": SMOKE_SWITCH},
    "out": {
        "leaf": "leaf1",
        "affected_runs": 3,
        "moves": {1: smoke_move(1.2, 6), 2: smoke_move(1.4, 6), 3: smoke_move(1.3, 4)},
        "incidents_on_leaf": NODES_PER_LEAF,
        "incidents_elsewhere": 0,
        "signals": ["heartbeat"],
        "silence_to_verdict_s": 21.0,
        "all_drained": True,
        "drained_not_on_leaf": [],
        "runs_not_active": [],
    },
    "ticks": [0.2, 0.25, 0.3],
}


def smoke() -> None:
    """The first mode's load against StubService for a second, and the storm's verdict on
    SMOKE_STORM with that load's tallies."""
    tokens = {sim_node(i): f"token-{i}" for i in range(SMOKE_NODES)}

    async def load() -> tuple[dict[str, float], Tally, Tally]:
        async with StubService() as stub:
            figures = await sustained(stub.port, 1.0, tokens, warmup_s=0.5)
            beats, batches = Tally(time.monotonic()), Tally(time.monotonic())
            until = time.monotonic() + 1.0
            await asyncio.gather(
                heartbeats(stub.port, tokens, until, beats),
                events(stub.port, tokens, until, batches, streams=1, pause_s=0.1),
            )
        return figures, beats, batches

    figures, beats, batches = asyncio.run(load())
    for key, value in figures.items():
        print(f"{key:32s} {value:10.3f}")
    storm_out = SMOKE_STORM["out"] | {"stored_events": batches.accepted}
    windows = {"first_period": beats.p99_between(0, math.inf)}
    storm_result = storm_report(
        SMOKE_STORM["ready"], storm_out, beats, batches, windows, SMOKE_STORM["ticks"]
    )
    result = sustained_report(figures) | {
        "smoke": True,
        "inputs": "a stand-in service (no dev cluster, no Postgres); a made-up storm outcome",
        "storm": storm_result,
    }
    print(json.dumps(result, default=str))


def sustained_report(figures: dict[str, float]) -> dict[str, Any]:
    """The first mode's JSON object: its figures, the targets and "target_met"."""
    met = (
        figures["events_per_s"] >= TARGET_EVENTS_PER_S
        and figures["event_batch_p99_s"] < TARGET_P99_S
        and figures["heartbeat_p99_s"] < TARGET_P99_S
        and figures["failed_requests"] == 0
    )
    targets = {
        "events_per_s": TARGET_EVENTS_PER_S,
        "p99_s": TARGET_P99_S,
        "simulated_nodes": NUM_NODES,
        "heartbeat_period_s": HEARTBEAT_PERIOD_S,
    }
    return {"bench": "control_plane", "figures": figures, "targets": targets, "target_met": met}


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--in-memory-reconciler":
        in_memory_reconciler(Path(sys.argv[2]), int(sys.argv[3]))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument(
        "--nodes",
        type=int,
        default=None,
        help="a leaf switch fails under this many nodes (in-memory Slurm); --seconds before",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="the load generator against a stand-in: seconds"
    )
    args = parser.parse_args()
    if args.smoke:
        smoke()
        return
    if args.nodes:
        storm(args.nodes, args.seconds)
        return
    dev = DevCluster(default_state_dir())
    port = free_port()
    url = fresh_database()
    with tempfile.TemporaryDirectory() as state:
        mint_token_file(url, Path(state) / "admin.token", user="bench", team="ops", role=Role.ADMIN)
        admin_token = (Path(state) / "admin.token").read_text().strip()
        agent_tokens = mint_agent_tokens(url)
        proc = start_service(url, dev, port, Path(state))
        try:
            figures = asyncio.run(sustained(port, args.seconds, agent_tokens))
            time.sleep(2)  # let the reconciler register the real nodes
            figures["leaf_burst_to_all_drained_s"] = leaf_burst(
                f"http://127.0.0.1:{port}", admin_token
            )
        finally:
            proc.terminate()
            proc.wait(timeout=15)
    for key, value in figures.items():
        print(f"{key:32s} {value:10.3f}")
    print(json.dumps(sustained_report(figures)))


if __name__ == "__main__":
    main()
