"""The node health agent: kernel log (Xid/SXid), NVML, NCCL lines in run logs, heartbeats.

Everything it sees goes through the on-disk outbox, so it reaches the service in order and
exactly once even if the service or the agent restarts in between.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import threading
import time
import uuid
from pathlib import Path

import httpx
from runyard_client.errors import InsecureTransport
from runyard_client.tls import check_token_transport, client_context

from worker.agent.nvml import NvmlWatcher
from worker.agent.outbox import Outbox
from worker.agent.sources import (
    FileFollower,
    poll_kernel_file,
    poll_kmsg,
    scan_run_logs,
    signal_event,
)

log = logging.getLogger("runyard.agent")
BATCH = 200


def headers() -> dict[str, str]:
    token = os.environ.get("RUNYARD_AGENT_TOKEN") or os.environ.get("RUNYARD_TOKEN")
    return {"Authorization": f"Bearer {token}"} if token else {}


def deliver(client: httpx.Client, node: str, outbox: Outbox) -> int:
    """Send queued events oldest first; stop at the first failure and keep the rest."""
    sent = 0
    while batch := outbox.peek(BATCH):
        try:
            response = client.post(
                f"/v1/nodes/{node}/events", json={"events": [e for _, e in batch]}
            )
        except httpx.HTTPError as exc:
            log.warning("service unreachable (%s); %d events wait on disk", exc, len(outbox))
            return sent
        if response.status_code >= 500 or response.status_code == 429:
            log.warning("service answered %s; retrying later", response.status_code)
            return sent
        if response.status_code >= 400:
            # Refused as invalid: retrying cannot help, and it must not block what follows.
            log.error(
                "service refused %d events (%s): %s",
                len(batch),
                response.status_code,
                response.text[:500],
            )
        outbox.ack(batch[-1][0])
        sent += len(batch)
    return sent


class Agent:
    def __init__(self, args: argparse.Namespace) -> None:
        self.node, self.args = args.node, args
        state = args.state_dir or Path("/var/lib/runyard-agent") / args.node
        self.outbox = Outbox(Path(state) / "outbox.sqlite")
        self.kernel = (
            FileFollower(args.kernel_log, "kernel", self.outbox) if args.kernel_log else None
        )
        self.kmsg_fd = None if args.kernel_log else self._open_kmsg()
        self.nvml = NvmlWatcher()
        self.stop = threading.Event()
        # The node's token goes to the service over HTTPS verified against RUNYARD_CA (or
        # the system's store), or over plain HTTP to loopback only (runyard_client.tls).
        check_token_transport(args.service_url)
        # Its cluster on every request (`?cluster=`): node names repeat across clusters. None:
        # the service's default cluster, all a site of one cluster ever needs.
        self.client = httpx.Client(
            base_url=args.service_url,
            timeout=5.0,
            headers=headers(),
            verify=client_context(),
            params={"cluster": args.cluster} if args.cluster else None,
        )

    def _open_kmsg(self) -> int | None:
        try:
            return os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK)
        except OSError as exc:
            log.warning("cannot read /dev/kmsg (%s); pass --kernel-log FILE", exc)
            return None

    def watch_once(self) -> None:
        if self.kernel is not None:
            poll_kernel_file(self.node, self.kernel)
        elif self.kmsg_fd is not None:
            poll_kmsg(self.node, self.outbox, self.kmsg_fd)
        for kind, gpu, message in self.nvml.poll():
            self.outbox.put(
                [
                    signal_event(
                        self.node,
                        f"{self.node}:nvml:{uuid.uuid4()}",
                        kind,
                        None,
                        message,
                        {"gpu": gpu},
                    )
                ]
            )

    def heartbeat(self) -> None:
        try:
            self.client.post(
                f"/v1/nodes/{self.node}/heartbeat",
                json={"agent_version": "0.2", "gpu_present": self.nvml.available},
            )
        except httpx.HTTPError as exc:
            log.warning("heartbeat not delivered: %s", exc)

    def run(self) -> None:
        next_beat = next_logs = 0.0
        clock = threading.Event()
        while not self.stop.is_set():
            now = time.monotonic()
            try:
                self.watch_once()
                if self.args.run_logs and now >= next_logs:
                    scan_run_logs(self.node, self.args.run_logs, self.outbox)
                    next_logs = now + 5.0
            except Exception:
                log.exception("reading the node's signals failed; retrying")
            deliver(self.client, self.node, self.outbox)
            if now >= next_beat:
                self.heartbeat()
                next_beat = now + self.args.interval_s
            clock.wait(self.args.poll_s)
            if self.stop.is_set():
                break


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="runyard agent", description="runyard node health agent")
    parser.add_argument("--node", required=True, help="Slurm node name this agent watches")
    parser.add_argument(
        "--cluster",
        default=os.environ.get("RUNYARD_AGENT_CLUSTER") or None,
        help="Slurm ClusterName of its node (default: $RUNYARD_AGENT_CLUSTER, else the "
        "service's default cluster)",
    )
    parser.add_argument(
        "--service-url", default=os.environ.get("RUNYARD_URL", "http://127.0.0.1:8000")
    )
    parser.add_argument(
        "--kernel-log",
        type=Path,
        default=None,
        help="a file to follow for kernel messages (default: /dev/kmsg)",
    )
    parser.add_argument(
        "--run-logs", default=None, help="glob of run log files to scan for NCCL errors"
    )
    parser.add_argument(
        "--state-dir",
        type=Path,
        default=None,
        help="read positions and the outbox (default /var/lib/runyard-agent/NODE)",
    )
    parser.add_argument("--interval-s", type=float, default=2.0, help="heartbeat period")
    parser.add_argument("--poll-s", type=float, default=0.25, help="signal polling period")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s agent[{args.node}] %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request is noise
    try:
        agent = Agent(args)
    except InsecureTransport as refused:
        raise SystemExit(f"runyard agent: {refused}") from None
    signal.signal(signal.SIGTERM, lambda *_: agent.stop.set())
    signal.signal(signal.SIGINT, lambda *_: agent.stop.set())
    agent.run()
