"""How long the planner takes for the largest run in scope: 405B on 10,240 H100s.

Each timed plan starts with empty caches, so every figure is a cold plan, as the service
would see it for a new request.

    .venv/bin/python bench/planner_speed.py [--smoke]   # --smoke: one plan per case

The last line is one JSON object with the figures, the target and "target_met".
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO_ROOT))

from planner.plan import plan  # noqa: E402
from planner.presets import MODEL_PRESETS  # noqa: E402
from planner.step_time import layer_time  # noqa: E402

TARGET_S = 1.0
REPEATS = 5
CASES = [  # (label, seq_len, global batch tokens)
    ("405b-10240gpu-seq8k", 8192, 16 * 2**20),
    ("405b-10240gpu-seq128k", 131_072, 16 * 2**20),
]


def time_plan(seq_len: int, global_batch_tokens: int) -> tuple[float, int]:
    """Seconds for one cold plan, and how many layouts it looked at."""
    layer_time.cache_clear()
    started = time.perf_counter()
    result = plan(MODEL_PRESETS["llama3-405b"], "h100-sxm", 10_240, seq_len, global_batch_tokens)
    elapsed = time.perf_counter() - started
    return elapsed, 1 + sum(result.rejected.values())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--smoke", action="store_true", help="one cold plan per case, not 5")
    args = parser.parse_args()
    repeats = 1 if args.smoke else REPEATS
    figures: list[dict[str, Any]] = []
    worst_all = 0.0
    for label, seq_len, batch in CASES:
        times, considered = [], 0
        for _ in range(repeats):
            elapsed, considered = time_plan(seq_len, batch)
            times.append(elapsed)
        worst = max(times)
        worst_all = max(worst_all, worst)
        print(
            f"{label}: {considered:,} layouts, median {statistics.median(times) * 1e3:.0f} ms, "
            f"worst {worst * 1e3:.0f} ms (target < {TARGET_S:.0f} s)"
        )
        figures.append(
            {
                "case": label,
                "layouts_considered": considered,
                "median_s": round(statistics.median(times), 4),
                "worst_s": round(worst, 4),
            }
        )
    summary = {
        "bench": "planner_speed",
        "smoke": args.smoke,
        "figures": figures,
        "target": {"worst_s": TARGET_S},
        "target_met": worst_all < TARGET_S,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
