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

    .venv/bin/python bench/recovery.py --smoke   # no dev cluster: the arithmetic only

--smoke touches no cluster and no service: it computes both modes' figures, targets and
JSON line from made-up incidents and metric rows in the API's shape (SMOKE_*, below), so
that the parts that run after a long dev-cluster run are known to work before it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from bench.recovery_compare import DEFAULT_PACE_S, compare, figures, verdict  # noqa: E402
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
    return split_of(incident)


def split_of(incident: dict[str, Any]) -> dict[str, float]:
    """Seconds of each phase of one recovery, and in all, from its incident (pure)."""
    t = {
        k: datetime.fromisoformat(incident[k])
        for k in ("signal_at", "drained_at", "submitted_at", "running_at", "first_step_at")
    }
    split = {name: (t[b] - t[a]).total_seconds() for name, a, b in PHASES}
    split["total"] = (t["first_step_at"] - t["signal_at"]).total_seconds()
    return split


def summary(rounds: list[dict[str, float]]) -> dict[str, Any]:
    """The bench's JSON object: each round, the medians, the target and "target_met"."""
    return {
        "bench": "recovery",
        "rounds": rounds,
        "median_s": {k: statistics.median(r[k] for r in rounds) for k in rounds[0]},
        "targets": {"signal_to_first_resumed_step_s": TARGET_S},
        "target_met": max(r["total"] for r in rounds) < TARGET_S,
    }


# --smoke's inputs, made up in the shape the API returns. Incidents: the phases as
# docs/design.md gives them (drain 0.5 s, resubmit 0.6 s, queue and start 0.8 s) and a start-up.
SMOKE_PHASE_S = [(0.5, 0.6, 0.8, 6.1), (0.4, 0.6, 0.9, 5.8), (0.6, 0.5, 0.8, 6.4)]
T0 = 1_800_000_000.0  # an epoch second


def _at(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat()


def smoke_incident(phases_s: tuple[float, ...]) -> dict[str, Any]:
    keys = ("signal_at", "drained_at", "submitted_at", "running_at", "first_step_at")
    marks = [T0 + sum(phases_s[:i]) for i in range(len(keys))]
    return dict(zip(keys, map(_at, marks), strict=True))


def smoke_rows(attempt: int, steps: range, sent: float, step_s: float) -> list[dict[str, Any]]:
    """One metric report's rows, as GET /runs/{id}/metrics returns them."""
    return [
        {"attempt_id": attempt, "step": s, "recorded_at": _at(sent), "step_time_s": step_s}
        for s in steps
    ]


def smoke_compare() -> dict[str, Any]:
    """--compare's figures and verdict on made-up rows: a classic path that resumes from
    step 5 after an Xid at step 10, and a fast path whose survivor covers the lost group's
    share until a replacement heals (as tests/unit/test_recovery_compare.py)."""
    rows = smoke_rows(1, range(1, 11), T0 + 10, 1.0) + smoke_rows(1, range(11, 12), T0 + 11, 1.0)
    rows += smoke_rows(2, range(6, 13), T0 + 40, 1.0) + smoke_rows(2, range(13, 26), T0 + 53, 1.0)
    classic = figures(rows, T0 + 10.5, T0 + 11.5, ranks=4, replacement=None, from_disk={2})
    rows = [r for g in (1, 2) for r in smoke_rows(g, range(1, 6), T0 + 5, 1.0)]
    rows += smoke_rows(2, range(6, 7), T0 + 6, 1.0) + smoke_rows(1, range(6, 10), T0 + 14, 2.0)
    rows += smoke_rows(3, range(10, 12), T0 + 15, 1.0) + smoke_rows(1, range(10, 26), T0 + 30, 1.0)
    fast = figures(rows, T0 + 6.5, T0 + 7.5, ranks=4, replacement=3, from_disk=set())
    return verdict("dp", DEFAULT_PACE_S, classic, fast)


def smoke() -> None:
    rounds = [split_of(smoke_incident(phases)) for phases in SMOKE_PHASE_S]
    for n, split in enumerate(rounds):
        print(f"round {n + 1}: " + ", ".join(f"{k} {v:.1f} s" for k, v in split.items()))
    result = smoke_compare()
    for path in ("classic", "fast"):
        print(f"{path}: " + ", ".join(f"{k} {v}" for k, v in result[path].items()))
    print(f"fast/classic GPU-seconds lost: {result['fast_over_classic_gpu_s']}")
    out = summary(rounds)
    print(
        json.dumps(
            out
            | {
                "smoke": True,
                "inputs": "made up in the API's shape; no cluster",
                "compare": result,
                "target_met": out["target_met"] and result["target_met"],
            }
        )
    )


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
    parser.add_argument(
        "--smoke", action="store_true", help="both modes' arithmetic on made-up inputs, no cluster"
    )
    args = parser.parse_args()
    if args.smoke:
        smoke()
        return
    dev = DevCluster(default_state_dir())
    client = RunyardClient(dev.service_url)
    if args.compare:
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
    out = summary(rounds)
    print("median: " + ", ".join(f"{k} {v:.1f} s" for k, v in out["median_s"].items()))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
