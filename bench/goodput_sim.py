"""Goodput of Llama 3 405B on 10,240 H100s over 30 days of failures, decided by runyard's code.

A discrete-event simulation (sim/): failures at Llama 3's published rate and cause mix,
each reported as its cause would be and handled by the service's own policy functions
(classification, drain, spare choice, pool size, checkpoint interval, shrink, fast or
classic path); only Slurm (the in-memory SlurmClient), time and the GPUs are simulated.
The phase costs are measured here or published (sim/costs.py says which).

    .venv/bin/python bench/goodput_sim.py [--days 30] [--seeds 5]

Prints the service's policy at Llama 3's rate (goodput, badput by phase, recoveries by
path, the worst hour, the chance the spare pool ran dry over the seeds), the same run on
today's classic path only, then a sweep over failure rate x1, x3, x10 and pool sizes with
the phase to blame in each row. Deterministic for its seeds. The last line is one JSON
object with the figures, the targets (>= 98.5% at x1 with <= 1.5% of nodes as spares,
>= 95% at x10) and "target_met".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from sim.engine import SimConfig, SimResult, simulate  # noqa: E402
from sim.run_shape import planned_run  # noqa: E402

TARGET_X1 = 0.985  # ByteRobust reports 97% over three months on 9,600 GPUs
TARGET_X10 = 0.95
MAX_SPARE_SHARE = 0.015
RATES = (1.0, 3.0, 10.0)


def runs(config: SimConfig, seeds: int) -> list[SimResult]:
    return [simulate(SimConfig(**{**config.__dict__, "seed": s})) for s in range(seeds)]


def summary(results: list[SimResult]) -> dict[str, object]:
    """Means over the seeds; the worst hour over all of them; the share of seeds dry."""
    first = results[0]
    badput = {k: statistics.mean(r.badput[k] for r in results) for k in first.badput}
    recoveries: dict[str, float] = {}
    for r in results:
        for k, v in r.recoveries.items():
            recoveries[k] = recoveries.get(k, 0) + v / len(results)
    worst = min((r.worst_hour[1], i, r.worst_hour[0]) for i, r in enumerate(results))
    return {
        "goodput": statistics.mean(r.goodput for r in results),
        "goodput_min": min(r.goodput for r in results),
        "badput": badput,
        "blame": max(badput, key=lambda k: badput[k]),
        "recoveries": recoveries,
        "worst_hour": {"seed": worst[1], "hour": worst[2], "goodput": worst[0]},
        "pool_nodes": first.pool_size,
        "pool_share": first.pool_size / planned_run().num_nodes,
        "pool_ran_dry_chance": sum(r.pool_ran_dry for r in results) / len(results),
        "nodes_without_spare": statistics.mean(r.nodes_without_spare for r in results),
        "failures": statistics.mean(r.failures for r in results),
        "checkpoint_interval_s": first.checkpoint_interval_s,
    }


def show(title: str, s: dict[str, object]) -> None:
    badput = s["badput"]
    assert isinstance(badput, dict)
    print(f"{title}")
    print(
        f"  goodput {s['goodput']:.2%} (worst seed {s['goodput_min']:.2%}); "
        f"spares {s['pool_nodes']} ({s['pool_share']:.2%} of nodes); "
        f"checkpoint every {s['checkpoint_interval_s']:.0f} s; "
        f"{s['failures']:.0f} interruptions"
    )
    print("  badput: " + ", ".join(f"{k} {v:.2%}" for k, v in badput.items()))
    rec = s["recoveries"]
    assert isinstance(rec, dict)
    print("  recoveries per run: " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(rec.items())))
    worst = s["worst_hour"]
    assert isinstance(worst, dict)
    print(
        f"  worst hour: {worst['goodput']:.1%} (seed {worst['seed']}, hour {worst['hour']}); "
        f"spare pool ran dry in {s['pool_ran_dry_chance']:.0%} of runs "
        f"({s['nodes_without_spare']:.1f} nodes found none, mean)"
    )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--seeds", type=int, default=5)
    args = parser.parse_args()
    shape = planned_run()
    print(
        f"Llama 3 405B on {shape.num_gpus:,} H100s ({shape.num_nodes} nodes): "
        f"{shape.replica_groups} replica groups of {shape.group_nodes} nodes, "
        f"step {shape.step_s:.1f} s (the planner's layout); {args.days:.0f} days, "
        f"{args.seeds} seeds"
    )
    started = time.monotonic()
    one = simulate(SimConfig(days=args.days))
    one_run_s = time.monotonic() - started
    costs = one.costs
    print(
        "phase costs (s): detect "
        + ", ".join(f"{k.value} {v:.1f}" for k, v in costs.detect_s.items())
        + f"; classic restart {costs.classic_restart_s:.1f}; group restart "
        f"{costs.group_restart_s:.1f}; checkpoint stall {costs.checkpoint_stall_s:.2f}"
    )
    policy = summary(runs(SimConfig(days=args.days), args.seeds))
    classic = summary(runs(SimConfig(days=args.days, fast_path=False), args.seeds))
    show("the service's policy (fast path where it applies), Llama 3's rate:", policy)
    show("today's classic path only, same failures:", classic)

    pool_share = MAX_SPARE_SHARE * shape.num_nodes
    pools: list[int | None] = [None, 0, 5, int(pool_share)]
    print("\nsweep (mean goodput over the seeds; the phase with the most badput to blame):")
    print(f"{'rate':>5} {'spares':>10} {'fast':>8} {'classic':>8}  dry   blame (fast / classic)")
    sweep = []
    for rate in RATES:
        for pool in pools:
            cells = {
                path: summary(
                    runs(SimConfig(days=args.days, scale=rate, pool=pool, fast_path=fast), 3)
                )
                for path, fast in (("fast", True), ("classic", False))
            }
            f, c = cells["fast"], cells["classic"]
            label = f"{f['pool_nodes']}" + (" policy" if pool is None else "")
            print(
                f"{rate:>4.0f}x {label:>10} {f['goodput']:>8.2%} {c['goodput']:>8.2%}  "
                f"{f['pool_ran_dry_chance']:>3.0%}   {f['blame']} / {c['blame']}"
            )
            sweep.append(
                {
                    "rate": rate,
                    "pool": f["pool_nodes"],
                    "policy_pool": pool is None,
                    "fast": f["goodput"],
                    "classic": c["goodput"],
                    "pool_ran_dry_chance": f["pool_ran_dry_chance"],
                    "blame_fast": f["blame"],
                    "blame_classic": c["blame"],
                }
            )
    x10 = next(r for r in sweep if r["rate"] == 10.0 and r["policy_pool"])
    x1_ok = bool(policy["goodput"] >= TARGET_X1 and policy["pool_share"] <= MAX_SPARE_SHARE)  # type: ignore[operator]
    x10_ok = bool(x10["fast"] >= TARGET_X10)  # type: ignore[operator]
    print(
        f"\none 30-day run simulated in {one_run_s:.2f} s; x1: {policy['goodput']:.2%} with "
        f"{policy['pool_share']:.2%} spares (target >= 98.5% with <= 1.5%); "
        f"x10: {x10['fast']:.2%} (target >= 95%)"
    )
    print(
        json.dumps(
            {
                "bench": "goodput_sim",
                "days": args.days,
                "seeds": args.seeds,
                "one_run_s": round(one_run_s, 3),
                "policy_x1": policy,
                "classic_x1": classic,
                "sweep": sweep,
                "targets": {
                    "goodput_x1": TARGET_X1,
                    "max_spare_share_x1": MAX_SPARE_SHARE,
                    "goodput_x10": TARGET_X10,
                    "one_run_s": 60,
                },
                "target_met": x1_ok and x10_ok and one_run_s < 60,
            },
            default=str,
        )
    )


if __name__ == "__main__":
    main()
