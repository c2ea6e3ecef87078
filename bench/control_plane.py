"""The control plane under a 10,240-GPU cluster's load, on the real service and Postgres.

1,280 simulated agents heartbeat every 5 s (256 requests/s) while node events stream in
batches; then a whole leaf switch of the dev cluster (its 4 real nodes) reports Xid 79 at
once and we time how long the recovery loop takes to drain all of them in Slurm.

    runyard dev up && .venv/bin/python bench/control_plane.py [--seconds 20]

The service runs as its own process on a database of its own (`runyard_bench`). The last
line is one JSON object with the figures, the targets (>= 5,000 events/s sustained, p99
ingest latency < 100 ms) and "target_met".
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

from client.devcluster.cluster import DevCluster, default_state_dir  # noqa: E402
from service.auth.bootstrap import mint_token_file  # noqa: E402
from service.models import Role  # noqa: E402

DATABASE = "runyard_bench"
ADMIN_URL = "postgresql://postgres@127.0.0.1:5432/postgres"
NUM_NODES = 1280
HEARTBEAT_PERIOD_S = 5.0
EVENT_BATCH = 100
TARGET_EVENTS_PER_S = 5000
TARGET_P99_S = 0.100
LEAF = ["gpu001", "gpu002", "gpu003", "gpu004"]
XID_79 = "NVRM: Xid (PCI:0000:3b:00): 79, pid=1, name=python, GPU has fallen off the bus."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def fresh_database() -> str:
    url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{DATABASE}"
    with psycopg.connect(ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{DATABASE}"')
    subprocess.run([sys.executable, "-m", "alembic", "-c", str(REPO_ROOT / "alembic.ini"),
                    "upgrade", "head"], check=True, cwd=REPO_ROOT, capture_output=True,
                   env={**os.environ, "RUNYARD_DATABASE_URL": url})
    with psycopg.connect(url.replace("+psycopg", "")) as conn:
        conn.execute(
            "INSERT INTO nodes (name, state, state_reason, slurm_state, slurm_reason, addr, "
            "num_gpus, num_app_errors) SELECT 'sim' || lpad(i::text, 4, '0'), 'HEALTHY', "
            "'simulated', 'IDLE', '', '10.0.0.1', 8, 0 FROM generate_series(1, %s) AS i",
            (NUM_NODES,))
    return url


def start_service(url: str, dev: DevCluster, port: int, state: Path) -> subprocess.Popen[bytes]:
    env = {**os.environ, "RUNYARD_DATABASE_URL": url, "RUNYARD_PORT": str(port),
           "RUNYARD_STATE_DIR": str(state), "RUNYARD_SLURM_CONF": str(dev.slurm_conf),
           "SLURM_CONF": str(dev.slurm_conf), "RUNYARD_HEARTBEAT_SUSPECT_S": "60"}
    with open(state / "svc.log", "wb") as log:  # the child keeps its own descriptor
        proc = subprocess.Popen(
            [sys.executable, "-m", "uvicorn", "service.app:create_app", "--factory", "--host",
             "127.0.0.1", "--port", str(port), "--log-level", "warning"],
            env=env, cwd=REPO_ROOT, stdout=subprocess.DEVNULL, stderr=log)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1).status_code == 200:
                return proc
        except httpx.HTTPError:
            time.sleep(0.3)
    raise SystemExit("bench: the service did not start")


async def heartbeats(client: httpx.AsyncClient, until: float, lat: list[float]) -> int:
    """Every simulated node once per period, spread evenly over it."""
    sent, gap = 0, HEARTBEAT_PERIOD_S / NUM_NODES
    start = time.monotonic()
    pending: set[asyncio.Task[None]] = set()

    async def one(name: str) -> None:
        t0 = time.perf_counter()
        response = await client.post(f"/v1/nodes/{name}/heartbeat", json={})
        response.raise_for_status()
        lat.append(time.perf_counter() - t0)

    while time.monotonic() < until:
        name = f"sim{sent % NUM_NODES + 1:04d}"
        task = asyncio.create_task(one(name))
        pending.add(task)
        task.add_done_callback(pending.discard)
        sent += 1
        await asyncio.sleep(max(0.0, start + sent * gap - time.monotonic()))
    await asyncio.gather(*pending)
    return sent


async def events(client: httpx.AsyncClient, until: float, lat: list[float]) -> int:
    """Batches of observe-only events (corrected-ECC Xid 92) as fast as they are accepted."""
    accepted = 0

    async def stream(worker: int) -> None:
        nonlocal accepted
        n = worker
        while time.monotonic() < until:
            node = f"sim{n % NUM_NODES + 1:04d}"
            batch = [{"idempotency_key": str(uuid.uuid4()), "kind": "xid", "code": 92,
                      "message": "NVRM: Xid (PCI:0000:3b:00): 92, High single-bit ECC error "
                      "rate"} for _ in range(EVENT_BATCH)]
            t0 = time.perf_counter()
            response = await client.post(f"/v1/nodes/{node}/events", json={"events": batch})
            response.raise_for_status()
            lat.append(time.perf_counter() - t0)
            accepted += response.json()["accepted"]
            n += 4

    await asyncio.gather(*(stream(w) for w in range(4)))
    return accepted


async def sustained(url: str, seconds: float, token: str) -> dict[str, float]:
    limits = httpx.Limits(max_connections=64)
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits,
                                 headers=headers) as client:
        beat_lat: list[float] = []
        event_lat: list[float] = []
        start = time.monotonic()
        until = start + seconds
        beats, accepted = await asyncio.gather(heartbeats(client, until, beat_lat),
                                               events(client, until, event_lat))
        elapsed = time.monotonic() - start
    q = lambda xs, p: statistics.quantiles(xs, n=100)[p - 1]  # noqa: E731
    return {
        "seconds": elapsed, "heartbeats_per_s": beats / elapsed,
        "events_per_s": accepted / elapsed,
        "event_batch_p50_s": q(event_lat, 50), "event_batch_p99_s": q(event_lat, 99),
        "heartbeat_p50_s": q(beat_lat, 50), "heartbeat_p99_s": q(beat_lat, 99),
    }


def leaf_burst(url: str, token: str) -> float:
    """All four nodes of leaf1 report Xid 79 at once: seconds until all are drained."""
    started = time.monotonic()
    with httpx.Client(base_url=url, timeout=30,
                      headers={"Authorization": f"Bearer {token}"}) as client:
        for node in LEAF:
            client.post(f"/v1/nodes/{node}/events", json={"events": [{
                "idempotency_key": str(uuid.uuid4()), "kind": "xid", "code": 79,
                "message": XID_79}]}).raise_for_status()
        while time.monotonic() - started < 60:
            drained = {i["node_name"] for i in client.get("/v1/admin/incidents").json()
                       if i["drained_at"] and i["node_name"] in LEAF}
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
        # One admin token for the simulated fleet: 1,280 agent tokens would only add rows.
        mint_token_file(url, Path(state) / "admin.token", user="bench", team="ops",
                        role=Role.ADMIN)
        token = (Path(state) / "admin.token").read_text().strip()
        proc = start_service(url, dev, port, Path(state))
        base = f"http://127.0.0.1:{port}"
        try:
            figures = asyncio.run(sustained(base, args.seconds, token))
            time.sleep(2)  # let the reconciler register the real nodes
            figures["leaf_burst_to_all_drained_s"] = leaf_burst(base, token)
        finally:
            proc.terminate()
            proc.wait(timeout=15)
    for key, value in figures.items():
        print(f"{key:32s} {value:10.3f}")
    met = (figures["events_per_s"] >= TARGET_EVENTS_PER_S
           and figures["event_batch_p99_s"] < TARGET_P99_S
           and figures["heartbeat_p99_s"] < TARGET_P99_S)
    print(json.dumps({"bench": "control_plane", "figures": figures, "targets": {
        "events_per_s": TARGET_EVENTS_PER_S, "p99_s": TARGET_P99_S,
        "simulated_nodes": NUM_NODES, "heartbeat_period_s": HEARTBEAT_PERIOD_S},
        "target_met": met}))


if __name__ == "__main__":
    main()
