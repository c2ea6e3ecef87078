"""`bench/recovery.py --compare`: the classic path against the fast path, same run, same Xid.

Both runs are the same spec on the same nodes, the tiny model, in one of two layouts
(`--layout`): `dp` (4 nodes of 1 GPU, data parallel; the fast one as 4 replica groups of one
node) or `tp2pp2` (4 nodes of 2 GPUs, tp 2 x pp 2 x dp 2; the fast one as 2 replica groups
of two nodes, each a complete tp 2 x pp 2 copy). Each is hit by a real-format Xid 79 in one
node's
kernel log half a checkpoint interval after a commit (the average failure's distance from
its last checkpoint), read by the node's real health agent. From the run's metric rows:

- when each step finished: a report carries the steps of one window, the last finished
  when the report was sent and each earlier one a mean step time before it;
- the step reached at the Xid (S): the highest step finished before the Xid line;
- seconds to the next productive step: from the Xid line to the first step above S that
  is not trained again later (the classic path's failed attempt trains on until its
  scancel; a restarted run redoes those steps);
- steps recomputed: steps at or below S that an attempt restarted from disk finished
  again (the fast path's step in flight, aborted and redone, is in the survivors' stall);
- GPU-seconds lost, ranks idle or recomputing, summed. Classic: every rank from the Xid to
  the next productive step. Fast: the surviving groups' stall (their report windows that
  took longer than usual, from the Xid to just after the rejoin) on their ranks, plus the
  failed group's ranks from the Xid to its replacement's first step (the spare joining).

Targets: the fast path recomputes at most 1 step and loses at most a third of the classic
path's GPU-seconds.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from client.api import RunyardClient
from client.devcluster.cluster import DevCluster
from client.devcluster.demo import inject_xid_79, spares_held


@dataclass(frozen=True)
class BenchLayout:
    """One layout both paths train: its nodes, ranks per node, and replica groups."""

    nodes: int
    gpus_per_node: int
    groups: int  # the fast path's replica groups
    parallelism: dict[str, int] | str

    @property
    def ranks(self) -> int:
        return self.nodes * self.gpus_per_node


LAYOUTS = {
    "dp": BenchLayout(nodes=4, gpus_per_node=1, groups=4, parallelism="auto"),
    "tp2pp2": BenchLayout(nodes=4, gpus_per_node=2, groups=2, parallelism={"tp": 2, "pp": 2}),
}
CHECKPOINT_EVERY = 60
SPEC: dict[str, Any] = {
    "model": "tiny",
    "seq_len": 128,
    "global_batch": 8,
    "steps": 100_000,
    "lr": 3e-3,
    "checkpoint_every": CHECKPOINT_EVERY,
    "max_restarts": 0,
}


def _wait(what: str, probe: Any, timeout_s: float = 180.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := probe():
            return value
        time.sleep(0.2)
    raise SystemExit(f"bench: timed out waiting for {what}")


def step_finish_times(rows: list[dict[str, Any]]) -> dict[int, list[tuple[int, float]]]:
    """{attempt id: [(step, finished at, epoch s)]} from the metric rows (pure)."""
    reports: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        reports[(row["attempt_id"], row["recorded_at"])].append(row)
    out: dict[int, list[tuple[int, float]]] = defaultdict(list)
    for (attempt_id, recorded_at), report in reports.items():
        sent = datetime.fromisoformat(recorded_at).timestamp()
        last = max(r["step"] for r in report)
        for r in report:
            out[attempt_id].append((r["step"], sent - (last - r["step"]) * (r["step_time_s"] or 0)))
    return out


def figures(
    rows: list[dict[str, Any]],
    xid_at: float,
    ranks: int,
    failed_ranks: int,
    failed: int,
    replacement: int | None,
    from_disk: set[int],
) -> dict[str, float]:
    """The figures of one path (pure; see the module docstring). `failed` is the attempt
    the Xid ended, `replacement` the fast path's new attempt for its group."""
    done = step_finish_times(rows)
    everything = [(s, t) for steps in done.values() for s, t in steps]
    reached = max(s for s, t in everything if t <= xid_at)
    # A step finished after the Xid is productive unless an attempt restarted from disk
    # after the Xid trains it again (the classic path's doomed attempt trains on until its
    # scancel, and the restarted run redoes those steps); a healed replacement trains
    # alongside the survivors, it redoes nothing.
    redone = {s for a in from_disk for s, _ in done.get(a, [])}
    next_at = min(
        t
        for a, steps in done.items()
        for s, t in steps
        if s > reached and t > xid_at and (a in from_disk or s not in redone)
    )
    # Trained again: steps at or below S that a restarted attempt finished again (a
    # surviving group finishing step S a little after the failed one is not a recompute).
    recomputed = {s for a in from_disk for s, t in done.get(a, []) if s <= reached}
    stall = 0.0
    if replacement is None:  # classic: every rank waits for the restarted run
        lost = ranks * (next_at - xid_at)
    else:
        # The survivors go on until the failed group's job is killed, then stall (the
        # quorum drops it, the step in flight is redone) and again briefly when the
        # replacement joins. A report's window carries its mean step time, so a stall
        # shows as the window taking longer than usual: every survivor window that ended
        # between the Xid and just after the rejoin counts what it took beyond its usual
        # steps (this also counts the survivors' slower degraded steps, which do train:
        # pessimistic for the fast path). The failed group's GPUs count as lost from the
        # Xid line until its replacement's first step (its old job trained on until the
        # scancel: pessimistic again).
        # The replacement's first report, not its back-dated first step: that window's mean
        # step time includes the start-up and the heal, which would date its first step
        # before the replacement even started (pessimistic for the fast path).
        rejoined = min(
            datetime.fromisoformat(row["recorded_at"]).timestamp()
            for row in rows
            if row["attempt_id"] == replacement
        )
        windows: dict[tuple[int, str], list[dict[str, Any]]] = defaultdict(list)
        for row in rows:
            if row["attempt_id"] not in (failed, replacement):
                windows[(row["attempt_id"], row["recorded_at"])].append(row)
        timed = [
            (datetime.fromisoformat(at).timestamp(), len(w), w[0]["step_time_s"] or 0.0)
            for (_, at), w in windows.items()
        ]
        last_sent = {
            a: max(datetime.fromisoformat(at).timestamp() for b, at in windows if b == a)
            for a, _ in windows
        }
        if any(sent < rejoined + 5.0 for sent in last_sent.values()):
            raise ValueError("the survivors have not reported past the rejoin yet")
        usual = sorted(step_s for sent, _, step_s in timed if sent <= xid_at)
        typical = usual[len(usual) // 2] if usual else 0.0
        survivor_groups = len({a for a, _ in windows})
        stall = sum(
            max(0.0, k * (step_s - typical))
            for sent, k, step_s in timed
            if xid_at < sent <= rejoined + 5.0
        ) / max(1, survivor_groups)  # per group: the groups stall together
        lost_ranks = ranks - failed_ranks
        lost = lost_ranks * stall + failed_ranks * (rejoined - xid_at)
    return {
        "step_at_xid": reached,
        "xid_to_next_productive_step_s": round(next_at - xid_at, 2),
        "survivors_stall_s": round(stall, 2),
        "gpu_s_lost": round(lost, 1),
        "steps_recomputed": len(recomputed),
    }


def _metrics(client: RunyardClient, run_id: int) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    while batch := client.run_metrics(
        run_id, after_step=rows[-1]["step"] if rows else -1, limit=10_000
    ):
        rows += batch
        if len(batch) < 10_000:
            break
    return rows


def one_path(
    client: RunyardClient, dev: DevCluster, fast: bool, layout: BenchLayout
) -> dict[str, float]:
    spec = {
        **SPEC,
        "name": f"bench-compare-{'fast' if fast else 'classic'}",
        "nodes": layout.nodes,
        "gpus_per_node": layout.gpus_per_node,
        "parallelism": layout.parallelism,
    }
    groups = layout.groups if fast else 1
    if fast:
        spec["fault_tolerance"] = {"replica_groups": groups}
    run_id = client.submit_run(spec)["id"]
    try:

        def live() -> list[dict[str, Any]]:
            return [a for a in client.get_run(run_id)["attempts"] if a["state"] == "RUNNING"]

        def ready() -> bool:
            commits = [c["step"] for c in client.run_checkpoints(run_id) if c["state"] != "WRITING"]
            step = client.get_run(run_id)["last_step"] or 0
            return (
                len(live()) == groups
                and bool(commits)
                and step >= max(commits) + CHECKPOINT_EVERY // 2
            )

        _wait("training half an interval past a commit", ready, timeout_s=300)
        before = {a["id"]: a for a in client.get_run(run_id)["attempts"]}
        victim = max(live(), key=lambda a: a["replica_group"] or 0)
        node = victim["nodes"][-1]
        xid_at = time.time()
        inject_xid_79(dev.kern_log(node), pid=0)

        def recovered() -> dict[str, Any] | None:
            attempts = client.get_run(run_id)["attempts"]
            new = [a for a in attempts if a["id"] not in before and a["first_step"] is not None]
            return new[0] if new else None

        replacement = _wait("the replacement's first step", recovered)
        failed_ranks = layout.ranks // groups  # the failed node's group (all, classic)

        def measured() -> dict[str, float] | None:
            try:  # until a step past the one reached at the Xid has been reported
                return figures(
                    _metrics(client, run_id),
                    xid_at,
                    ranks=layout.ranks,
                    failed_ranks=failed_ranks,
                    failed=victim["id"],
                    from_disk={
                        a["id"]
                        for a in client.get_run(run_id)["attempts"]
                        if a["id"] not in before and a["resume_step"] is not None
                    },
                    replacement=replacement["id"] if fast else None,
                )
            except ValueError:
                return None

        result: dict[str, float] = _wait("a step past the Xid's", measured)
    finally:
        client.cancel_run(run_id)
    client.resume_node(node)
    return result


def compare(client: RunyardClient, dev: DevCluster, layout: str = "dp") -> dict[str, Any]:
    results: dict[str, Any] = {}
    with spares_held(client, 1):
        for fast in (False, True):
            _wait("a spare", lambda: client.get_spares()["members"])
            results["fast" if fast else "classic"] = one_path(client, dev, fast, LAYOUTS[layout])
    classic, fast = results["classic"], results["fast"]
    ratio = fast["gpu_s_lost"] / classic["gpu_s_lost"] if classic["gpu_s_lost"] else float("inf")
    return {
        "layout": layout,
        **results,
        "fast_over_classic_gpu_s": round(ratio, 3),
        "targets": {"fast_steps_recomputed_max": 1, "fast_over_classic_gpu_s_max": 1 / 3},
        "target_met": fast["steps_recomputed"] <= 1 and ratio <= 1 / 3,
    }
