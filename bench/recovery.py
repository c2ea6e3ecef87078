"""Recovery timing over repeated injected GPU failures, on the dev cluster's real parts.

Each round writes a real-format Xid 79 into the kernel log of one node of a training run (the
node's real health agent reads it), then waits for the drain, the spare taking over and the
first resumed step, and reads the incident's timestamps from the service. Between rounds the
drained node is resumed so the spare pool refills.

    runyard dev up && .venv/bin/python bench/recovery.py [--rounds 3]
    runyard dev up && .venv/bin/python bench/recovery.py --compare [--layout dp|tp2pp2] [--pace-s S]

--compare runs bench/recovery_compare.py instead: the classic path against the fast path
(replica groups) on the same run and the same injected Xid 79, in a data-parallel layout
(dp: 4 groups of one node) or tp 2 x pp 2 (tp2pp2: 2 groups of two nodes of 2 GPUs), with
every step paced to stand in for a device's compute (--pace-s; why: its docstring).

The last line is one JSON object with the figures, the target (signal in the log to first
resumed step under 30 s for the tiny model) and "target_met".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from client.api import RunyardClient  # noqa: E402
from client.devcluster.cluster import DevCluster, default_state_dir  # noqa: E402
from client.devcluster.demo import inject_xid_79, spares_held  # noqa: E402

TARGET_S = 30.0
PHASES = [
    ("detect+drain", "signal_at", "drained_at"),
    ("end attempt+resubmit", "drained_at", "submitted_at"),
    ("queue+start", "submitted_at", "running_at"),
    ("start-up+load", "running_at", "first_step_at"),
]


def wait(what: str, probe: Any, timeout_s: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := probe():
            return value
        time.sleep(0.2)
    raise SystemExit(f"bench: timed out waiting for {what}")


def one_round(client: RunyardClient, dev: DevCluster, run_id: int) -> dict[str, float]:
    def committed() -> list[int]:
        return [c["step"] for c in client.run_checkpoints(run_id) if c["state"] == "COMMITTED"]

    def training_past_a_commit() -> bool:
        run = client.get_run(run_id)
        steps = committed()
        return bool(
            run["attempts"]
            and run["attempts"][-1]["state"] == "RUNNING"
            and steps
            and (run["last_step"] or 0) >= max(steps) + 3
            and run["attempts"][-1]["first_step"] is not None
        )

    wait("a running attempt with a commit", training_past_a_commit)
    before = len(client.get_run(run_id)["attempts"])
    wait("a spare", lambda: client.get_spares()["members"])
    node = client.get_run(run_id)["nodes"][-1]
    inject_xid_79(dev.kern_log(node), pid=0)
    incident = wait(
        "the resumed first step",
        lambda: next(
            (
                i
                for i in client.list_incidents(20)
                if i["run_id"] == run_id
                and i["node_name"] == node
                and i["state"] == "RESOLVED"
                and len(client.get_run(run_id)["attempts"]) > before
            ),
            None,
        ),
    )
    client.resume_node(node)
    t = {
        k: datetime.fromisoformat(incident[k])
        for k in ("signal_at", "drained_at", "submitted_at", "running_at", "first_step_at")
    }
    split = {name: (t[b] - t[a]).total_seconds() for name, a, b in PHASES}
    split["total"] = (t["first_step_at"] - t["signal_at"]).total_seconds()
    return split


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--compare", action="store_true", help="classic path against fast path, one Xid each"
    )
    parser.add_argument(
        "--layout",
        choices=("dp", "tp2pp2"),
        default="dp",
        help="--compare's layout: data parallel, or tp 2 x pp 2 in each replica group",
    )
    parser.add_argument(
        "--pace-s",
        type=float,
        default=None,
        help="--compare's floor on a step, per share of the batch, standing in for a device's "
        "compute (default 1; 0: unpaced; see bench/recovery_compare.py)",
    )
    args = parser.parse_args()
    dev = DevCluster(default_state_dir())
    client = RunyardClient(dev.service_url)
    if args.compare:
        from bench.recovery_compare import DEFAULT_PACE_S, compare

        pace_s = DEFAULT_PACE_S if args.pace_s is None else args.pace_s
        result = compare(client, dev, args.layout, pace_s)
        for path in ("classic", "fast"):
            print(f"{path}: " + ", ".join(f"{k} {v}" for k, v in result[path].items()), flush=True)
        print(f"fast/classic GPU-seconds lost: {result['fast_over_classic_gpu_s']}")
        print(json.dumps({"bench": "recovery_compare", **result}))
        return
    spec = {
        "name": "bench-recovery",
        "model": "tiny",
        "nodes": 2,
        "gpus_per_node": 1,
        "seq_len": 128,
        "global_batch": 8,
        "steps": 100_000,
        "lr": 3e-3,
        "checkpoint_every": 20,
        "max_restarts": 0,
    }
    rounds = []
    with spares_held(client, 1):
        run_id = client.submit_run(spec)["id"]
        try:
            for n in range(args.rounds):
                split = one_round(client, dev, run_id)
                rounds.append(split)
                print(
                    f"round {n + 1}: " + ", ".join(f"{k} {v:.1f} s" for k, v in split.items()),
                    flush=True,
                )
        finally:
            client.cancel_run(run_id)
    medians = {k: statistics.median(r[k] for r in rounds) for k in rounds[0]}
    print("median: " + ", ".join(f"{k} {v:.1f} s" for k, v in medians.items()))
    print(
        json.dumps(
            {
                "bench": "recovery",
                "rounds": rounds,
                "median_s": medians,
                "targets": {"signal_to_first_resumed_step_s": TARGET_S},
                "target_met": max(r["total"] for r in rounds) < TARGET_S,
            }
        )
    )


if __name__ == "__main__":
    main()
