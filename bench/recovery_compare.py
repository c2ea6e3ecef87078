"""`bench/recovery.py --compare`: the classic path against the fast path, same run, same Xid.

Both runs are the same spec on the same nodes, the tiny model, in one of two layouts
(`--layout`): `dp` (4 nodes of 1 GPU, data parallel; the fast one as 4 replica groups of one
node) or `tp2pp2` (4 nodes of 2 GPUs, tp 2 x pp 2 x dp 2; the fast one as 2 replica groups
of two nodes, each a complete tp 2 x pp 2 copy). Each is hit by a real-format Xid 79 in one
node's kernel log half a checkpoint interval after a commit (the average failure's distance
from its last checkpoint), read by the node's real health agent.

Paced steps (`--pace-s`, default 1 s). On a GPU cluster a step's compute is the device's:
the host is mostly idle, each node has its own CPUs, and a restart reloads and recomputes
steps that each take seconds. The dev cluster is 8 nodes on this machine's few cores, and
the tiny model's CPU step takes a fraction of a second, so unpaced it measures something
else: the fast path's replacement group starts while the survivors' ranks take every core
(its ranks' start-up took 17 s there against the classic path's 14 s on idle cores), and the
classic path recomputes 30 steps in a few seconds. With a pace, every rank sleeps out each
step to `pace-s` per share of the global batch it trained (the `pace_step` fault hook; a
survivor covering a lost group's share takes twice as long, as a device would), which
leaves the cores idle as a GPU host's are. The pace is not fitted to the target: at 1 s the
classic path's mean recompute (30 steps, 30 s) is about twice its restart (~15 s), while at
405B the planner's interval gives 147 s of mean recompute against a 43.8 s restart
(sim/costs.py), 3.4 times: the bench still charges the classic path less recompute than
real runs pay. `--pace-s 0` measures the unpaced figure. The dev service
forwards RUNYARD_FAULT to jobs from its own environment, so the bench restarts the dev
cluster's service and agents with the pace for its two runs (by name) and again without it
afterwards.

From the run's metric rows:
- when each step finished, approximately: rank 0 posts what it has every report interval
  (2 s), so one post carries one window or a few; its last step is dated when the service
  recorded the post and each earlier one its window's mean step time before it (a step
  may be dated up to one interval late; the count waits REPORT_LAG_S past its end for
  the posts to arrive);
- the step reached at the Xid (S): the highest step finished before the Xid line;
- seconds to the next productive step: from the Xid line to the first step above S that
  is not trained again later (the classic path's failed attempt trains on until its
  scancel; a restarted run redoes those steps);
- steps recomputed: steps at or below S that an attempt restarted from disk finished
  again (the fast path's step in flight, aborted and redone, is in its lost time);
- GPU-seconds lost, the same measure for both paths: every rank of the run, from the Xid
  until the run has trained SETTLED_S at its usual pace after the recovery (the classic
  path's next productive step, the fast path's replacement's first report), less the
  steps above S it finished meanwhile, each worth the usual step time on every rank. A
  failed group's idle GPUs, a survivors' stall, a step trained twice and a survivor's
  slower steps covering a missing share all show as steps the run did not finish. On the
  dev cluster an Xid is a log line and the failed attempt trains on until the service
  ends it; a GPU that fell off the bus would hold its peers in their collectives until
  then. So on both paths no step finished before the failed attempt ended counts (the
  classic path redoes them anyway).

Targets: the fast path recomputes at most 1 step and loses at most a third of the classic
path's GPU-seconds.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from client.api import RunyardClient
from client.devcluster import cluster
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
# After the recovery, the run trains this long at its usual pace before the count ends: a
# survivor's stall when the replacement joins falls inside it.
SETTLED_S = 10.0
REPORT_LAG_S = 4.0  # two report intervals: the posts of the steps before the count's end
DEFAULT_PACE_S = 1.0
RUN_NAMES = {False: "bench-compare-classic", True: "bench-compare-fast"}
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
    failed_until: float,
    ranks: int,
    replacement: int | None,
    from_disk: set[int],
) -> dict[str, float]:
    """The figures of one path (pure; see the module docstring). `failed_until` is when
    the service ended the attempt the Xid hit, `replacement` the fast path's new attempt
    for the failed group (None: the classic path), `from_disk` the attempts restarted from
    a checkpoint after the Xid. Raises ValueError until the rows can tell (the restarted
    run caught up with the doomed attempt, REPORT_LAG_S past SETTLED_S after the recovery)."""
    done = step_finish_times(rows)
    everything = [(s, t) for steps in done.values() for s, t in steps]
    before = [s for s, t in everything if t <= xid_at]
    if not before:
        raise ValueError("no step was reported before the Xid")
    reached = max(before)
    if from_disk:  # the doomed attempt's steps count only once the restart redid them
        restarted = max((s for a in from_disk for s, _ in done.get(a, [])), default=0)
        if restarted < max(s for a, steps in done.items() if a not in from_disk for s, _ in steps):
            raise ValueError("the restarted run has not caught up with the failed attempt")
    # A step finished after the Xid is productive unless an attempt restarted from disk
    # after the Xid trains it again (the classic path's doomed attempt trains on until its
    # scancel, and the restarted run redoes those steps); a healed replacement trains
    # alongside the survivors, it redoes nothing. Each step counts once, when first done.
    redone = {s for a in from_disk for s, _ in done.get(a, [])}
    productive: dict[int, float] = {}
    for a, steps in done.items():
        for s, t in steps:
            if s > reached and t > failed_until and (a in from_disk or s not in redone):
                productive[s] = min(t, productive.get(s, t))
    if not productive:
        raise ValueError("no step past the Xid's yet")
    next_at = min(productive.values())
    # Trained again: steps at or below S that a restarted attempt finished again (a
    # surviving group finishing step S a little after the failed one is not a recompute).
    recomputed = {s for a in from_disk for s, t in done.get(a, []) if s <= reached}
    sent = [datetime.fromisoformat(r["recorded_at"]).timestamp() for r in rows]
    if replacement is None:
        recovered_at = next_at
    else:
        # The replacement's first report, not its back-dated first step: that window's
        # mean step time includes the start-up and the heal.
        recovered_at = min(
            (t for r, t in zip(rows, sent, strict=True) if r["attempt_id"] == replacement),
            default=None,
        )
        if recovered_at is None:
            raise ValueError("the replacement has not reported yet")
    end = recovered_at + SETTLED_S
    if max(sent) < end + REPORT_LAG_S:
        raise ValueError("the run has not reported past the recovery yet")
    # The usual step: the median report window's mean step time before the Xid.
    windows = {
        (r["attempt_id"], t): r["step_time_s"] or 0.0 for r, t in zip(rows, sent, strict=True)
    }
    usual = sorted(step_s for (_, t), step_s in windows.items() if t <= xid_at)
    if not usual:
        raise ValueError("no report was sent before the Xid")
    typical = usual[len(usual) // 2]
    finished = sum(1 for t in productive.values() if t <= end)
    lost = ranks * ((end - xid_at) - finished * typical)
    return {
        "step_at_xid": reached,
        "usual_step_s": round(typical, 3),
        "xid_to_next_productive_step_s": round(next_at - xid_at, 2),
        "xid_to_recovered_s": round(recovered_at - xid_at, 2),
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
        "name": RUN_NAMES[fast],
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

        def measured() -> dict[str, float] | None:
            try:  # until the run has trained SETTLED_S past the recovery
                attempts = client.get_run(run_id)["attempts"]
                ended = next(a["ended_at"] for a in attempts if a["id"] == victim["id"])
                if ended is None:
                    raise ValueError("the failed attempt has not ended yet")
                return figures(
                    _metrics(client, run_id),
                    xid_at,
                    failed_until=datetime.fromisoformat(ended).timestamp(),
                    ranks=layout.ranks,
                    replacement=replacement["id"] if fast else None,
                    from_disk={
                        a["id"]
                        for a in attempts
                        if a["id"] not in before and a["resume_step"] is not None
                    },
                )
            except ValueError:
                return None

        result: dict[str, float] = _wait("the run settled past the recovery", measured)
    finally:
        client.cancel_run(run_id)
    client.resume_node(node)
    return result


@contextmanager
def paced_steps(dev: DevCluster, pace_s: float) -> Iterator[None]:
    """The dev cluster's service and agents restarted with `pace_s` for the bench's two runs
    (RUNYARD_FAULT, which the service forwards to its jobs), and again without it after."""
    if pace_s <= 0:
        yield
        return
    before = os.environ.get("RUNYARD_FAULT")
    paces = [f"pace_step:1:*@{name}={pace_s}" for name in RUN_NAMES.values()]
    os.environ["RUNYARD_FAULT"] = ",".join(filter(None, (before, *paces)))
    try:
        _restart_control_plane(dev)
        yield
    finally:
        if before is None:
            os.environ.pop("RUNYARD_FAULT", None)
        else:
            os.environ["RUNYARD_FAULT"] = before
        _restart_control_plane(dev)


def _restart_control_plane(dev: DevCluster) -> None:
    """Stop the dev service and agents if they run, and start them with this environment."""
    if any(n.startswith(("service:", "proxy")) for n in dev.table.load()):
        # service replicas behind a proxy: `up` would leave them as they are, unpaced
        raise SystemExit(
            "bench: --pace-s needs a dev cluster with one service replica; --pace-s 0 "
            "runs unpaced on any"
        )
    cluster.stop_control_plane(dev)
    try:
        cluster.up(cluster=dev, say=lambda _: None)
    except cluster.DevClusterError as exc:  # another shape than `dev up`'s defaults
        raise SystemExit(f"bench: the dev service did not come back: {exc}") from exc


def compare(
    client: RunyardClient, dev: DevCluster, layout: str = "dp", pace_s: float = DEFAULT_PACE_S
) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with paced_steps(dev, pace_s), spares_held(client, 1):
        for fast in (False, True):
            _wait("a spare", lambda: client.get_spares()["members"])
            results["fast" if fast else "classic"] = one_path(client, dev, fast, LAYOUTS[layout])
    return verdict(layout, pace_s, results["classic"], results["fast"])


def verdict(
    layout: str, pace_s: float, classic: dict[str, float], fast: dict[str, float]
) -> dict[str, Any]:
    """The comparison's figures, targets and "target_met" from each path's figures (pure)."""
    ratio = fast["gpu_s_lost"] / classic["gpu_s_lost"] if classic["gpu_s_lost"] else float("inf")
    return {
        "layout": layout,
        "pace_s": pace_s,
        "classic": classic,
        "fast": fast,
        "fast_over_classic_gpu_s": round(ratio, 3),
        "targets": {"fast_steps_recomputed_max": 1, "fast_over_classic_gpu_s_max": 1 / 3},
        "target_met": fast["steps_recomputed"] <= 1 and ratio <= 1 / 3,
    }
