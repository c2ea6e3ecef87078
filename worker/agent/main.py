"""The node health agent, heartbeat part: says every few seconds that its node is alive.

Kernel-log (Xid) parsing, NVML, NCCL scanning and the on-disk outbox come with the health
issue; this agent already runs per node so the service sees which nodes answer.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from pathlib import Path

import httpx

log = logging.getLogger("runyard.agent")


def gpu_present() -> bool:
    """NVML where a GPU exists; on the dev cluster there is none, and that is fine."""
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        count = pynvml.nvmlDeviceGetCount()
        pynvml.nvmlShutdown()
        return bool(count)
    except Exception:
        return False


def heartbeat_loop(node: str, service_url: str, interval_s: float, stop: threading.Event) -> None:
    has_gpu = gpu_present()
    if not has_gpu:
        log.info("no NVIDIA GPU visible on %s: NVML checks are off", node)
    with httpx.Client(base_url=service_url, timeout=5.0) as client:
        while not stop.is_set():
            try:
                client.post(f"/v1/nodes/{node}/heartbeat",
                            json={"agent_version": "0.1", "gpu_present": has_gpu})
            except httpx.HTTPError as exc:
                log.warning("heartbeat for %s not delivered: %s", node, exc)
            stop.wait(interval_s)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="runyard node health agent")
    parser.add_argument("--node", required=True, help="Slurm node name this agent watches")
    parser.add_argument("--service-url", default="http://127.0.0.1:8000")
    parser.add_argument("--kernel-log", type=Path, default=None,
                        help="file to follow for kernel messages (default: /dev/kmsg)")
    parser.add_argument("--state-dir", type=Path, default=None,
                        help="where the agent keeps its read position and outbox")
    parser.add_argument("--interval-s", type=float, default=3.0)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format=f"%(asctime)s agent[{args.node}] %(message)s")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    heartbeat_loop(args.node, args.service_url, args.interval_s, stop)
