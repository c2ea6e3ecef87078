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
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

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


def fresh_database() -> str:
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{DATABASE}"
    postgres.fresh_database(url)
    with psycopg.connect(url.replace("+psycopg", "")) as conn:
        conn.execute(
            "INSERT INTO nodes (name, state, state_reason, slurm_state, slurm_reason, addr, "
            "num_gpus, num_app_errors) SELECT 'sim' || lpad(i::text, 4, '0'), 'HEALTHY', "
            "'simulated', 'IDLE', '', '10.0.0.1', 8, 0 FROM generate_series(1, %s) AS i",
            (NUM_NODES,),
        )
    return url


def mint_agent_tokens(url: str) -> dict[str, str]:
    """One agent token per simulated node, as `runyard dev up` gives each real agent."""
    secrets = {sim_node(i): new_token() for i in range(NUM_NODES)}
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


def start_service(url: str, dev: DevCluster, port: int, state: Path) -> subprocess.Popen[bytes]:
    env = {
        **os.environ,
        "RUNYARD_DATABASE_URL": url,
        "RUNYARD_STATE_DIR": str(state),
        "RUNYARD_SLURM_CONF": str(dev.slurm_conf),
        "SLURM_CONF": str(dev.slurm_conf),
        "RUNYARD_HEARTBEAT_SUSPECT_S": "60",
    }
    with open(state / "svc.log", "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            [*service_argv(port), "--log-level", "warning"],
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
        self.accepted = 0
        self.failures: dict[str, int] = {}

    def ok(self, started: float, accepted: int = 0) -> None:
        if started < self.measured_from:
            self.warmup_latencies_s.append(time.monotonic() - started)
        else:
            self.latencies_s.append(time.monotonic() - started)
            self.accepted += accepted

    def fail(self, why: str) -> None:
        self.failures[why] = self.failures.get(why, 0) + 1


async def heartbeats(port: int, tokens: dict[str, str], until: float, tally: Tally) -> None:
    """Every simulated node once per period, spread evenly over it."""
    idle: asyncio.Queue[Connection] = asyncio.Queue()
    for _ in range(HEARTBEAT_CONNECTIONS):
        idle.put_nowait(await Connection.open(port))
    sent, gap = 0, HEARTBEAT_PERIOD_S / NUM_NODES
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
        task = asyncio.create_task(one(sim_node(sent), due))
        pending.add(task)
        task.add_done_callback(pending.discard)
        sent += 1
    await asyncio.gather(*pending)
    while not idle.empty():
        idle.get_nowait().close()


async def events(port: int, tokens: dict[str, str], until: float, tally: Tally) -> None:
    """Batches of observe-only events (corrected-ECC Xid 92) as fast as they are accepted."""

    async def stream(worker: int) -> None:
        conn = await Connection.open(port)
        n = worker
        while time.monotonic() < until:
            node = sim_node(n)
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
            n += EVENT_STREAMS
        conn.close()

    await asyncio.gather(*(stream(w) for w in range(EVENT_STREAMS)))


async def sustained(port: int, seconds: float, tokens: dict[str, str]) -> dict[str, float]:
    """One heartbeat period of warm-up, then `seconds` of the same load, measured."""
    start = time.monotonic()
    measured_from = start + WARMUP_S
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


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seconds", type=float, default=20.0)
    args = parser.parse_args()
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
    print(
        json.dumps(
            {"bench": "control_plane", "figures": figures, "targets": targets, "target_met": met}
        )
    )


if __name__ == "__main__":
    main()
