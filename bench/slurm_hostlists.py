"""Hostlists in-process against `scontrol show hostnames`, on the dev cluster's real Slurm.

Before the SlurmClient seam, every reconcile tick started one `scontrol show hostnames`
per watched job and one per reservation. This bench, side by side in one run:
1. agreement: random Slurm hostlists (padded and unpadded ranges, several bracket groups,
   comma lists) expanded by slurm/hostlist.py and by scontrol must list the same hosts, in
   the same order; and compress_hostlist's output must expand (by scontrol) to its input;
2. cost: expanding the node lists of N watched jobs, the old way (one scontrol each) and
   in-process, for N = 1, 8, 64.

    .venv/bin/python bench/slurm_hostlists.py [--cases 200]
    .venv/bin/python bench/slurm_hostlists.py --smoke   # no Slurm: recorded answers

Needs the dev cluster's Slurm tools (`runyard dev up`); it submits nothing. The last line
is one JSON object with the figures, the targets (every case agrees; in-process at least
100x cheaper than scontrol for 64 jobs) and "target_met". --smoke runs no scontrol: the
hostlists are compared with answers scontrol gave (SCONTROL_RECORDED, as in
tests/unit/test_slurm_hostlist.py), the random ones only round-trip in-process, and
scontrol's cost is a made-up SMOKE_SCONTROL_CALL_S a call.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from client.devcluster.cluster import DevCluster, default_state_dir  # noqa: E402

os.environ.setdefault("RUNYARD_SLURM_CONF", str(DevCluster(default_state_dir()).slurm_conf))

from service.slurm.commands import run_slurm  # noqa: E402
from service.slurm.hostlist import compress_hostlist, expand_hostlist  # noqa: E402
from service.slurm.target import SlurmTarget  # noqa: E402

TARGET_SPEEDUP = 100.0
SCONTROL_RECORDED = {  # `scontrol show hostnames` on each, recorded
    "gpu[001-004,007]": ["gpu001", "gpu002", "gpu003", "gpu004", "gpu007"],
    "gpu[8-11]": ["gpu8", "gpu9", "gpu10", "gpu11"],
    "gpu[099-101]": ["gpu099", "gpu100", "gpu101"],
    "a[1-2],b3,c[5]": ["a1", "a2", "b3", "c5"],
    "r[1-2]n[1-2]": ["r1n1", "r1n2", "r2n1", "r2n2"],
}
SMOKE_SCONTROL_CALL_S = 0.010  # made up: about one short process start
Expand = Callable[[str], list[str]]


def random_hostlist(rng: random.Random) -> str:
    """One Slurm hostlist of 1-3 expressions, each with 1-2 bracket groups."""
    exprs = []
    for _ in range(rng.randint(1, 3)):
        expr = rng.choice(["gpu", "node-", "r"])
        for _ in range(rng.randint(1, 2)):
            width = rng.choice([1, 2, 3, 4])
            items = []
            for _ in range(rng.randint(1, 3)):
                lo = rng.randint(0, 10**width // 2)
                hi = lo + rng.randint(0, 5)
                if len(str(hi)) > width:
                    hi = lo
                pad = f"0{width}d" if rng.random() < 0.7 else "d"
                items.append(f"{lo:{pad}}" if lo == hi else f"{lo:{pad}}-{hi:{pad}}")
            expr += f"[{','.join(items)}]" + rng.choice(["", "n"])
        exprs.append(expr.rstrip("n"))
    return ",".join(exprs)


def scontrol_hostnames(hostlist: str) -> list[str]:
    return run_slurm(SlurmTarget(""), ["scontrol", "show", "hostnames", hostlist]).split()


def recorded_hostnames(hostlist: str) -> list[str]:
    """--smoke's reference: scontrol's recorded answer, else (the random and compressed
    lists) our own expansion, so that those only round-trip."""
    return SCONTROL_RECORDED.get(hostlist) or expand_hostlist(hostlist)


def agreement(hostlists: list[str], reference: Expand) -> tuple[int, list[str]]:
    disagreements = []
    for hostlist in hostlists:
        ours = expand_hostlist(hostlist)
        if ours != reference(hostlist):
            disagreements.append(f"expand {hostlist}")
        compressed = compress_hostlist(ours)
        if sorted(reference(compressed)) != sorted(set(ours)):
            disagreements.append(f"compress {hostlist} -> {compressed}")
    return len(hostlists), disagreements


def cost(num_jobs: int, smoke: bool) -> tuple[float, float]:
    """Seconds to expand `num_jobs` node lists: one scontrol each (--smoke: made up), then
    in-process."""
    lists = [f"gpu[{8 * i + 1:04d}-{8 * i + 8:04d}]" for i in range(num_jobs)]
    if smoke:
        old_s = num_jobs * SMOKE_SCONTROL_CALL_S
    else:
        started = time.perf_counter()
        for node_list in lists:
            scontrol_hostnames(node_list)
        old_s = time.perf_counter() - started
    started = time.perf_counter()
    for _ in range(100):  # in-process is too quick to time once
        for node_list in lists:
            expand_hostlist(node_list)
    new_s = (time.perf_counter() - started) / 100
    return old_s, new_s


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=200)
    parser.add_argument("--smoke", action="store_true", help="no Slurm: recorded answers")
    args = parser.parse_args()

    rng = random.Random(7)
    hostlists = [random_hostlist(rng) for _ in range(20 if args.smoke else args.cases)]
    if args.smoke:
        hostlists += list(SCONTROL_RECORDED)
    reference = recorded_hostnames if args.smoke else scontrol_hostnames
    checked, disagreements = agreement(hostlists, reference)
    print(f"agreement with scontrol: {checked - len(disagreements)} of {checked} hostlists")
    for line in disagreements[:10]:
        print(f"  differs: {line}")
    figures: dict[str, object] = {"cases": checked, "disagreements": len(disagreements)}
    print(f"{'watched jobs':>12}  {'scontrol each (ms)':>18}  {'in-process (ms)':>15}  ratio")
    for num_jobs in (1, 8, 64):
        old_s, new_s = cost(num_jobs, args.smoke)
        ratio = old_s / new_s if new_s else float("inf")
        print(f"{num_jobs:>12}  {old_s * 1000:>18.1f}  {new_s * 1000:>15.3f}  {ratio:,.0f}x")
        figures[f"jobs_{num_jobs}"] = {
            "scontrol_ms": round(old_s * 1000, 2),
            "in_process_ms": round(new_s * 1000, 4),
            "speedup": round(ratio),
        }
    speedup_64 = figures["jobs_64"]["speedup"]  # type: ignore[index]
    targets = {"disagreements": 0, "speedup_at_64_jobs": TARGET_SPEEDUP}
    met = not disagreements and speedup_64 >= TARGET_SPEEDUP
    out = {"bench": "slurm_hostlists", "smoke": args.smoke, "figures": figures}
    print(json.dumps(out | {"targets": targets, "target_met": met}))
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
